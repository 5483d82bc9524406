"""The work item: a frozen dataclass, encoded as versioned JSON of at most 64 KiB.

Anything larger than the limit must go to a blob and be referred to by URL.
A message that fails to decode raises DecodeError, which is permanent.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from upwell.errors import DecodeError, InputRejected

SCHEMA_VERSION = 1
MAX_MESSAGE_BYTES = 64 * 1024


@dataclass(frozen=True)
class WorkItem:
    job_id: str
    shard_id: str
    payload: str
    pool: str
    params: dict[str, Any] = field(default_factory=dict)
    input_blob: str | None = None  # "<container>/<name>" of the staged input, if any
    checkpoint_prefix: str = ""  # "checkpoints/<job>/<shard>/"
    result_prefix: str = ""  # "results/<job>/<shard>"
    attempt: int = 1
    trace_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    ranks: int = 1  # MPI ranks in all, over every node (upwell.shape)
    gpus: int = 0
    nodes: int = 1  # nodes of one allocation (a gang) that the shard runs on
    oversubscribe: bool = False  # more ranks on a node than its cores was allowed
    payload_version: str = ""  # the definition's version that ingest validated the params against
    payload_sha256: str = ""  # and its content hash: a worker runs exactly that definition
    project: str = ""  # the job's project: what the worker writes for it carries the index tag project=<name>
    # an input_blob ending in "/" is a folder (a reduce's results/<job>/): every <shard>.json in it, and of each
    # shard's artifacts those matching one of these globs (upwell.after.reduce, workers.staging)
    input_select: list[str] = field(default_factory=list)
    # A shard that references its data: the byte range of input_blob at a pinned version (upwell.shardref)
    input_range: dict[str, Any] | None = None
    # A block of grid points (upwell.ingest.blocks): each point's own values over ``params``, run in turn
    # (workers.blocks); empty: the item is one point. Left out of the JSON when empty.
    points: list[dict[str, Any]] = field(default_factory=list)
    # The shard row as ingest wrote it: its ETag from the entity-group transaction's response, and its
    # ``queued_at``. An agent's first claim is then one write If-Match that ETag, with no read of the row
    # (workers.delivery). Empty where the sender did not write the row (a re-drive of an existing row, a
    # re-run). Left out of the JSON when empty; the ETag travels compactly (``compact_etag``).
    row_etag: str = ""
    queued_at: str = ""
    schema: int = SCHEMA_VERSION

    @property
    def result_blob(self) -> str:
        return f"{self.job_id}/{self.shard_id}.json"

    def with_attempt(self, attempt: int) -> WorkItem:
        return dataclasses.replace(self, attempt=attempt)


_OMITTED_EMPTY = ("points", "row_etag", "queued_at")  # left out of the JSON when empty: encoded as before them
# The Table service's ETags are weak tags over the entity's timestamp, as its sample responses show
# (W/"datetime'2008-09-18T23%3A46%3A19.4277424Z'"; learn.microsoft.com/rest/api/storageservices/insert-entity,
# query-entities); Azurite's are the same. A work item carries only the timestamp. An ETag is opaque, so any
# other form travels whole, and a wrong one could only fail its If-Match (the agent then reads the row).
_TABLE_ETAG = re.compile("W/\"datetime'([0-9A-Za-z.%-]+)'\"")


def compact_etag(etag: str) -> str:
    """A Table ETag as its timestamp, ':' unescaped (27 bytes of 47), where ``expand_etag`` gives the same
    ETag back; any other ETag as it is."""
    m = _TABLE_ETAG.fullmatch(etag)
    short = m.group(1).replace("%3A", ":") if m else etag
    return short if m and expand_etag(short) == etag else etag


def expand_etag(text: str) -> str:
    """The ETag of ``compact_etag``'s text; a whole ETag (weak ``W/"..."`` or strong ``"..."``) as it is."""
    if not text or text.startswith(("W/", '"')):
        return text
    return "W/\"datetime'" + text.replace(":", "%3A") + "'\""


def encode(item: WorkItem, limit: int = MAX_MESSAGE_BYTES) -> str:
    """Encode to JSON text; raise InputRejected naming the limit if too large."""
    data = dataclasses.asdict(item)
    for name in _OMITTED_EMPTY:  # an item without them is encoded as before they existed
        if not data[name]:
            del data[name]
    if data.get("row_etag"):
        if not data["row_etag"].startswith(("W/\"", '"')):
            raise InputRejected(f"work item for shard {item.shard_id}: row_etag {item.row_etag[:60]!r} is not an "
                                "entity tag (W/\"...\" or \"...\")", field="row_etag")
        data["row_etag"] = compact_etag(data["row_etag"])
    text = json.dumps(data, separators=(",", ":"), sort_keys=True)
    size = len(text.encode())
    if size > limit:
        raise InputRejected(
            f"work item for shard {item.shard_id} is {size} bytes; the limit is {limit}",
            field="params", limit=f"max_message_bytes={limit}")
    return text


_FIELDS = {f.name for f in dataclasses.fields(WorkItem)}
_REQUIRED = {f.name for f in dataclasses.fields(WorkItem)
             if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}


def decode(text: str | bytes) -> WorkItem:
    """Decode JSON (or base64-wrapped JSON, as some clients send) into a WorkItem."""
    try:
        raw = text.decode() if isinstance(text, bytes) else text
        raw = raw.strip()
        if raw[:1] not in ("{", "["):  # the Functions host's default queue encoding is base64
            raw = base64.b64decode(raw, validate=True).decode()
        data = json.loads(raw)
    except (UnicodeDecodeError, binascii.Error, json.JSONDecodeError, ValueError) as exc:
        raise DecodeError(f"work item is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise DecodeError("work item is not a JSON object")
    version = data.get("schema", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise DecodeError(f"work item schema {version!r} is not supported (expected {SCHEMA_VERSION})")
    missing = _REQUIRED - data.keys()
    if missing:
        raise DecodeError(f"work item lacks {sorted(missing)}")
    unknown = data.keys() - _FIELDS
    if unknown:
        raise DecodeError(f"work item has unknown fields {sorted(unknown)}")
    for name in ("row_etag", "queued_at"):
        if not isinstance(data.get(name, ""), str):
            raise DecodeError(f"work item field {name} is not a string")
    data["row_etag"] = expand_etag(data.get("row_etag", ""))
    try:
        return WorkItem(**data)
    except TypeError as exc:
        raise DecodeError(str(exc)) from None
