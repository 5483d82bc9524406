"""The ledger's row types: job and shard states with their terminal sets, and typed rows.

A row is read from Table `jobs` once, through ``from_entity``, which coerces every
field (Table storage returns what was written: a number may come back as a string,
a missing field as nothing). ``to_entity`` is the reverse. Only the ledger builds
rows from entities; everything else reads attributes. A field this module does not
know is kept in ``extra`` and written back, so a newer writer's fields survive.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, ClassVar

from upwell import names


class JobState(StrEnum):
    INGESTING = "ingesting"  # the job row exists; shards and messages are being written
    ACCEPTED = "accepted"  # every shard is queued
    RUNNING = "running"  # a shard has started
    SUCCEEDED = "succeeded"
    PARTIALLY_FAILED = "partially_failed"
    FAILED = "failed"
    REJECTED = "rejected"  # bad input: quarantined, no shards
    WAITING = "waiting"  # a manifest whose data/ blobs have not all arrived; no shards yet
    CANCELLED = "cancelled"  # upwell cancel: never dispatched again unless re-run (not terminal: a re-run reopens it)

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_JOB


class ShardState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    PREEMPTED = "preempted"  # visible again at once; resumes from its checkpoint
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # for good: poisoned, dropped (budget) or unusable input
    CANCELLED = "cancelled"  # its job was cancelled; a redelivery only acks it

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_SHARD


TERMINAL_JOB = frozenset({JobState.SUCCEEDED, JobState.PARTIALLY_FAILED, JobState.FAILED, JobState.REJECTED})
TERMINAL_SHARD = frozenset({ShardState.SUCCEEDED, ShardState.FAILED, ShardState.CANCELLED})
ACTIVE_JOB = (JobState.ACCEPTED, JobState.RUNNING)
FAILED_KEPT = 20  # failed shard ids the job row names


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _int(value: Any) -> int:
    try:
        return int(float(value or 0))
    except (TypeError, ValueError):
        return 0


def _float(value: Any) -> float:
    try:
        return float(value or 0)
    except (TypeError, ValueError):
        return 0.0


def _opt_float(value: Any) -> float | None:
    if value is None or value == "":
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _opt_int(value: Any) -> int | None:
    return None if value is None or value == "" else _int(value)


def _bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes")
    return bool(value)


def _written(entity: Any) -> str:
    """The server's last-write time of an entity, as a sortable string."""
    stamp = (getattr(entity, "metadata", None) or {}).get("timestamp")
    return stamp.isoformat(timespec="microseconds") if hasattr(stamp, "isoformat") else _text(stamp)


# Field annotations are strings here (postponed evaluation), so the table is keyed by their text.
_COERCE = {"str": _text, "int": _int, "float": _float, "bool": _bool, "float | None": _opt_float,
           "int | None": _opt_int}


class _Row:
    """from_entity/to_entity shared by both row types (fields typed str, int, float, bool, or Optional)."""

    _keys: ClassVar[tuple[str, str]]  # attribute names stored as PartitionKey and RowKey
    _meta: ClassVar[frozenset[str]] = frozenset({"extra", "written", "etag"})

    @classmethod
    def _field_types(cls) -> dict[str, str]:
        return {f.name: str(f.type) for f in fields(cls) if f.name not in cls._meta}  # type: ignore[arg-type]

    @classmethod
    def from_entity(cls, entity: Any):
        raw = dict(entity)
        pk, rk = cls._keys
        raw.setdefault(pk, raw.get("PartitionKey", ""))
        if rk:
            raw.setdefault(rk, raw.get("RowKey", ""))
        types = cls._field_types()
        kw: dict[str, Any] = {name: cls._coerce(name, types[name], raw[name]) for name in types if name in raw}
        extra = {k: v for k, v in raw.items() if k not in types and k not in ("PartitionKey", "RowKey")}
        meta = getattr(entity, "metadata", None) or {}
        return cls(**kw, extra=extra, written=_written(entity), etag=_text(meta.get("etag")))

    @classmethod
    def _coerce(cls, name: str, kind: Any, value: Any) -> Any:
        if name == "status":
            return cls._state(value)
        return _COERCE[str(kind)](value)

    @classmethod
    def _state(cls, value: Any):
        raise NotImplementedError

    def to_entity(self) -> dict[str, Any]:
        """PartitionKey, RowKey and every field (Optional fields that are None are left out)."""
        pk, rk = self._keys
        out: dict[str, Any] = {"PartitionKey": getattr(self, pk), "RowKey": getattr(self, rk) if rk else names.JOB_ROW}
        for name in self._field_types():
            value = getattr(self, name)
            if value is not None:
                out[name] = value.value if isinstance(value, StrEnum) else value
        return {**self.extra, **out}


@dataclass(frozen=True)
class JobRow(_Row):
    """The job row (RowKey "job"): what was asked, its counters, its cost and its report."""

    _keys: ClassVar[tuple[str, str]] = ("job_id", "")

    job_id: str = ""
    status: JobState = JobState.INGESTING
    name: str = ""
    description: str = ""
    payload: str = ""
    payload_version: str = ""  # the definition ingest validated against: version, content hash, image
    payload_sha256: str = ""
    payload_image: str = ""
    pool: str = ""
    source_blob: str = ""
    source_etag: str = ""
    manifest_hash: str = ""
    code_version: str = ""
    price_key: str = ""
    spot: bool = False
    ranks: int = 0
    gpus: int = 0
    nodes: int = 1  # nodes of one allocation per shard (upwell.shape)
    max_concurrency: int = 0
    budget_usd: float | None = None
    estimate_node_seconds_per_shard: float = 0.0
    estimate_node_seconds: float = 0.0
    estimate_usd: float = 0.0
    estimate_basis: str = ""  # how the estimate was made: from the manifest, or learned from earlier results
    estimate_spot_fraction: float | None = None
    node_share: float | None = None  # the job's share of a node: its CPUs or GPUs over the VM's
    owner: str = ""  # who uploaded it (the manifest's owner, else the upload's uploaded_by)
    project: str = ""
    spent_usd: float = 0.0
    shards_total: int = 0
    shards_done: int = 0
    shards_failed: int = 0
    failed_shards: str = ""  # the first FAILED_KEPT failed shard ids, comma-separated (status reads no shard scan)
    created_at: str = ""
    accepted_at: str = ""
    started_at: str = ""
    finished_at: str = ""
    message: str = ""
    message_at: str = ""
    error_field: str = ""
    error_row: int | None = None
    quarantine_blob: str = ""
    reported: bool = False
    reported_at: str = ""
    report_blob: str = ""
    report_claimed: float = 0.0
    report_count: int = 0
    wait_until: str = ""  # a waiting manifest is rejected after this
    cancelled_at: str = ""
    reruns: int = 0
    max_wall_clock_s: float | None = None  # the kill switches (upwell.cost.wallclock): the job's limit,
    max_shard_wall_clock_s: float | None = None  # one attempt's limit,
    killed_at: str = ""  # and when and why the janitor ended it
    killed_reason: str = ""
    ingest_owner: str = ""  # the ingest's lease (upwell.ingest.lease): who holds it,
    ingest_beat_at: float = 0.0  # when it last renewed it (epoch seconds; 0: released),
    ingest_sent: int = 0  # and how many of the job's work items, in shard order, had gone out by then
    points_total: int = 0  # a job of blocks (upwell.ingest.blocks): its grid points; 0: a point per shard
    points_per_item: int = 0  # and the points one shard (work item) carries; 0 or 1: one
    counter_targets: str = ""  # the shards each counter row counts by the job's end (upwell.counters.targets)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    written: str = ""  # the server's last-write time
    etag: str = ""
    # Read with its counter rows (upwell.counters): the figures above are summed; ``base`` keeps the job row's
    # own figures (what ``to_entity`` writes back) and ``counters`` each counter row with its ETag.
    counters: tuple[Any, ...] = field(default=(), compare=False)
    base: dict[str, Any] = field(default_factory=dict, compare=False)
    _meta: ClassVar[frozenset[str]] = _Row._meta | {"counters", "base"}

    @classmethod
    def _state(cls, value: Any) -> JobState:
        return JobState(value) if value else JobState.INGESTING

    def to_entity(self) -> dict[str, Any]:
        """The job row's entity: its own figures, never the sums with its counter rows."""
        return {**super().to_entity(), **self.base}

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_JOB

    def failed_ids(self) -> list[str]:
        return [s for s in self.failed_shards.split(",") if s]

    @property
    def over_budget(self) -> bool:
        return self.budget_usd is not None and self.spent_usd >= self.budget_usd


@dataclass(frozen=True)
class ShardRow(_Row):
    """One shard row: its state, where and how often it ran, and how its attempts ended."""

    _keys: ClassVar[tuple[str, str]] = ("job_id", "shard_id")

    job_id: str = ""
    shard_id: str = ""
    status: ShardState = ShardState.QUEUED
    pool: str = ""
    node: str = ""
    spot: bool = False
    params: str = "{}"  # JSON, sorted keys
    input_blob: str = ""
    input_sha256: str = ""
    input_range: str = ""  # JSON of the byte range at a pinned version the shard reads (upwell.shardref)
    result_blob: str = ""
    price_key: str = ""  # the shard's own price key, when it is not its job's
    attempts: int = 0
    preemptions: int = 0
    deferrals: int = 0
    failures: int = 0
    checkpoints: int = 0
    poisoned: bool = False
    queued_at: str = ""
    first_started_at: str = ""
    started_at: str = ""
    released_at: str = ""
    # The claim's place among the job's running shards (the per-job concurrency cap): the server's write
    # time of the claim, pinned here by the first later write to the running row (a duplicate delivery's
    # deferral or re-claim), whose own write time would otherwise move the shard behind newer claims.
    claim_key: str = ""
    finished_at: str = ""
    node_seconds: float = 0.0
    preempted_node_seconds: float = 0.0
    failed_node_seconds: float = 0.0
    cost_usd: float | None = None  # what its attempts cost, set when it ends
    cpu_s: float = 0.0  # the last attempt's CPU seconds (user + system, the payload and its children)
    max_rss_mb: float = 0.0  # the last attempt's peak resident set, its largest process (MiB)
    log_bytes: int | None = None  # what the last collected attempt's payload printed (0: nothing, so no log)
    error: str = ""
    stderr_tail: str = ""
    history: str = "[]"  # JSON list of earlier attempts: node, started, finished, status
    cancelled_at: str = ""
    reruns: int = 0
    points: str = ""  # a block's points: JSON list of each point's own values over ``params`` ("": one point)
    points_failed: str = ""  # a block's points that failed, by index, comma-separated (collect writes it)
    result_json: str = ""  # the result document as compact JSON where it fits a property (collect; the report reads it)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    written: str = ""
    etag: str = ""

    @property
    def claimed_running(self) -> bool:
        """Running and not yet released by its agent: one of the slots the job's cap counts."""
        return self.status == ShardState.RUNNING and not self.released_at

    @property
    def attempt_ended(self) -> bool:
        """Has an attempt of this shard ended? It started once and is not in its first attempt now. A reader
        then takes a missing payload.log for an empty one: an attempt that printed nothing keeps none
        (workers.staging.keep_log)."""
        return bool(self.first_started_at) and (self.status != ShardState.RUNNING or self.attempts > 1
                                                or self.preemptions > 0)

    @property
    def claim_place(self) -> str:
        """The sort key of this running shard's claim: pinned, else the row's last write (the claim)."""
        return self.claim_key or self.written

    @classmethod
    def _state(cls, value: Any) -> ShardState:
        return ShardState(value) if value else ShardState.QUEUED

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_SHARD

    @property
    def paid_seconds(self) -> float:
        """Node-seconds paid for: the last attempt, and the preempted and failed ones."""
        return self.node_seconds + self.preempted_node_seconds + self.failed_node_seconds

    @property
    def excused(self) -> int:
        """Deliveries that were not failed attempts: preemptions and concurrency-cap deferrals."""
        return self.preemptions + self.deferrals

    def attempts_history(self) -> list[dict[str, Any]]:
        try:
            past = json.loads(self.history or "[]")
        except ValueError:
            return []
        return past if isinstance(past, list) else []

    def block(self) -> list[dict[str, Any]]:
        """A block's points, each point's own values over ``parameters()``; [] for a one-point shard."""
        try:
            value = json.loads(self.points or "[]")
        except ValueError:
            return []
        return [p for p in value if isinstance(p, dict)] if isinstance(value, list) else []

    @property
    def point_count(self) -> int:
        """The grid points this shard runs: its block's, else one."""
        return len(self.block()) or 1

    def parameters(self) -> dict[str, Any]:
        try:
            value = json.loads(self.params or "{}")
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}
