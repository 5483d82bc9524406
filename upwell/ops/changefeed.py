"""Azure Blob Storage's change feed, read from a cursor: the records after it, each with its position.

The layout, from Microsoft's "Change feed support in Azure Blob Storage" (Consume the change feed,
Specifications) and the storage SDKs that read it:

* the container ``$blobchangefeed``; ``meta/segments.json`` holds ``lastConsumable``, the start of
  the last hourly segment a reader may consume (later ones are still being written);
* one segment per hour with changes: ``idx/segments/YYYY/MM/DD/HHMM/meta.json`` with ``status``
  (``Publishing`` or ``Finalized``) and ``chunkFilePaths``, one folder per shard
  (``$blobchangefeed/log/NN/YYYY/MM/DD/HHMM/``); ``1601/01/01/0000`` is an empty marker;
* in each shard folder, append blobs ``00000.avro``, ``00001.avro``, ... : Avro object container
  files whose records carry ``eventType`` (``BlobCreated``, ``BlobDeleted``, ..., ``Control``),
  ``subject`` (``/blobServices/default/containers/<c>/blobs/<name>``), ``eventTime``, ``id`` and
  ``data`` (``etag``, ``contentLength``, ``api``, ...).

A :class:`Cursor` is a segment (its ``YYYY/MM/DD/HHMM``) and, for each chunk of that segment read
so far, the byte offset of the first Avro block not yet consumed, the index of the first record in
it not consumed, and the length of the file's header. A read lists only the segment folders from the
cursor's day on, and downloads only each chunk's header and its bytes after the offset, so it costs
O(changes since the cursor), never O(blobs in the account).
"""

from __future__ import annotations

import datetime as dt
import io
import json
from dataclasses import dataclass, field

import fastavro
from azure.core.exceptions import ResourceNotFoundError

from upwell.ops.eventblobs import subject_blob

CONTAINER = "$blobchangefeed"
SEGMENTS_META = "meta/segments.json"
SEGMENT_ROOT = "idx/segments/"
BLOB_CREATED = "BlobCreated"
KEY_FORMAT = "%Y/%m/%d/%H%M"  # a segment's key: its folder under idx/segments/


def segment_key(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime(KEY_FORMAT)


def key_time(key: str) -> dt.datetime:
    return dt.datetime.strptime(key, KEY_FORMAT).replace(tzinfo=dt.UTC)


def parse_time(text: str) -> dt.datetime:
    """An ISO time as the feed writes it ('...Z', up to 7 decimals) as an aware UTC datetime."""
    return dt.datetime.fromisoformat(text).astimezone(dt.UTC)


@dataclass
class Cursor:
    """Where the next read starts. ``chunks``: chunk path -> [block offset, record index, header length]."""

    segment: str = ""
    chunks: dict[str, list[int]] = field(default_factory=dict)

    @classmethod
    def starting(cls, when: dt.datetime) -> Cursor:
        """A cursor that reads every segment from the hour before ``when`` on: a segment's time is
        only approximate (within 15 minutes, the docs say), so the hour before is read too."""
        start = when.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=1)
        return cls(segment_key(start))

    @classmethod
    def from_dict(cls, raw: dict) -> Cursor:
        chunks = {path: [int(x) for x in at] for path, at in (raw.get("chunks") or {}).items()}
        return cls(str(raw.get("segment") or ""), chunks)

    def to_dict(self) -> dict:
        return {"segment": self.segment, "chunks": self.chunks}


@dataclass(frozen=True)
class Record:
    """One change event, with where it sits: (chunk path, block offset, index in the block)."""

    event_type: str
    container: str
    name: str
    etag: str
    time: dt.datetime | None
    chunk: str
    position: tuple[int, int]


@dataclass(frozen=True)
class Segment:
    key: str
    status: str  # Publishing | Finalized
    shards: tuple[str, ...]


class ChangeFeed:
    """Reads one account's change feed through a ``$blobchangefeed`` ContainerClient. Keeps no state."""

    def __init__(self, container) -> None:
        self.container = container

    def enabled(self) -> bool:
        """Whether the account has a change feed at all (Azurite has none)."""
        return bool(self.container.exists())

    def last_consumable(self) -> dt.datetime | None:
        """``lastConsumable`` from meta/segments.json; None before the feed has a consumable segment."""
        try:
            meta = json.loads(self.container.get_blob_client(SEGMENTS_META).download_blob().readall())
        except ResourceNotFoundError:
            return None
        text = meta.get("lastConsumable")
        return parse_time(text) if text else None

    def segment_keys(self, since: str, until: dt.datetime) -> list[str]:
        """Keys of the segments from ``since`` to ``until`` (both included), oldest first: one listing
        per day since the cursor's (per year once the cursor is over a month old)."""
        last, first = segment_key(until), key_time(since).date()
        if (until.date() - first).days <= 31:
            days = range((until.date() - first).days + 1)
            prefixes = [f"{first + dt.timedelta(days=d):%Y/%m/%d}/" for d in days]
        else:
            prefixes = [f"{year:04d}/" for year in range(first.year, until.year + 1)]
        keys = set()
        for prefix in prefixes:
            for blob in self.container.list_blobs(name_starts_with=SEGMENT_ROOT + prefix):
                key = blob.name[len(SEGMENT_ROOT) :].rsplit("/", 1)[0]
                if blob.name.endswith("/meta.json") and since <= key <= last:
                    keys.add(key)
        return sorted(keys)

    def segment(self, key: str) -> Segment:
        meta = json.loads(self.container.get_blob_client(f"{SEGMENT_ROOT}{key}/meta.json").download_blob().readall())
        shards = tuple(p.removeprefix(f"{CONTAINER}/") for p in meta.get("chunkFilePaths") or [])
        return Segment(key, str(meta.get("status") or ""), shards)

    def chunks(self, shard: str) -> list[tuple[str, int]]:
        """(path, size) of a shard's chunk files, in the order they were written."""
        return sorted((b.name, int(b.size)) for b in self.container.list_blobs(name_starts_with=shard))

    def records(self, chunk: str, size: int, start: list[int] | None) -> tuple[list[Record], list[int]]:
        """The records of ``chunk`` from ``start`` ([block offset, index, header length]) to its last
        whole block, and the position after them (the chunk's cursor once all are consumed)."""
        offset, index, header = start or (0, 0, 0)
        if size == 0 or (offset and offset >= size):
            return [], [offset, index, header]
        client = self.container.get_blob_client(chunk)
        if offset == 0:
            data, base = client.download_blob(offset=0, length=size).readall(), 0
            header = _header_length(data)
            if header is None:
                return [], [0, 0, 0]  # not even a whole header yet
            offset = header
        else:
            head = client.download_blob(offset=0, length=header).readall()
            data, base = head + client.download_blob(offset=offset, length=size - offset).readall(), offset - header
        out: list[Record] = []
        blocks, end = _blocks(data, base)
        for block_offset, rows in blocks:
            skip = index if block_offset == offset else 0  # records an earlier pass consumed
            out += [_record(row, chunk, (block_offset, i)) for i, row in enumerate(rows) if i >= skip]
        return out, ([end, 0, header] if end > offset else [offset, index, header])


def _header_length(data: bytes) -> int | None:
    fo = io.BytesIO(data)
    try:
        fastavro.reader(fo)
    except (EOFError, ValueError):
        return None
    return fo.tell()


def _blocks(data: bytes, base: int) -> tuple[list[tuple[int, list[dict]]], int]:
    """(file offset, records) of each whole block, and the file offset after the last one. A block
    cut short (the feed is still appending it) ends the read; the next read starts there."""
    out, end = [], 0
    try:
        for block in fastavro.block_reader(io.BytesIO(data)):
            rows = list(block)
            out.append((block.offset + base, rows))
            end = block.offset + block.size + base
    except (EOFError, ValueError, StopIteration):
        pass
    return out, end


def _record(row: dict, chunk: str, position: tuple[int, int]) -> Record:
    container, name = subject_blob(str(row.get("subject") or "")) or ("", "")
    data = row.get("data") or {}
    etag = str(data.get("etag") or "")
    try:
        when = parse_time(str(row["eventTime"]))
    except (KeyError, ValueError):
        when = None
    return Record(
        event_type=str(row.get("eventType") or ""),
        container=container,
        name=name,
        etag=etag if not etag or etag.startswith('"') else f'"{etag}"',
        time=when,
        chunk=chunk,
        position=position,
    )
