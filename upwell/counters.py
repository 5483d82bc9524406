"""Sharded job counters: the rows that count a job's finished shards, so that no one row is a hot spot.

Why: one job row that every finishing shard rewrites under its ETag serialises the finishes of a job: each
conflict is a re-read and a retry (0.69 retries per shard at four slots, more at thousands of completions a
second). Azure's answer to a hot entity is to spread its writes over several entities and sum them on read
(the "sharded counter" shape; Table storage serves a range of one partition in one query and commits an
entity-group transaction over one partition atomically: learn.microsoft.com/rest/api/storageservices/
performing-entity-group-transactions and .../azure/storage/tables/table-storage-design-patterns). Every row
here stays in the job's partition, so a finish is still one transaction of its shard row and one counter
row, and the whole partition's target (about 2,000 entities a second, Table storage's scalability targets)
is the ceiling, not the one row's ETag round trip.

Layout, in the job's partition (PartitionKey = job id): the job row (RowKey ``job``) and up to ``SHARDS``
counter rows ``job.c00`` .. ``job.c15``, all in the RowKey range [``job``, ``job/``): '.' sorts just before
'/', and shard ids (``s00000`` ..) sort after it, so one range query reads the job row and its counters and
nothing else, and every shard listing excludes that range (``SHARD_ROWS``). A shard counts on the counter row
its id hashes to (CRC-32, stable across processes, unlike ``hash``).

A counter row holds additive deltas (``done``, ``failed``, ``spent_usd``, its own ``failed_shards``); the
job's figures are the job row's own fields plus the sum of its counter rows (``summed``). Every other writer
of the job row (ingest, a re-drive's merge, cancel) writes the job row's own fields as before and stays
correct; a job without counter rows (written before them) reads the same. The job's close and a re-run fold
the counters into the job row and delete them in one transaction (``upwell.jobcounts``), so an ended job is
one row again.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from upwell import names
from upwell.rows import FAILED_KEPT, JobRow, JobState

PREFIX = "job.c"  # counter rows: job.c00 .. job.c<SHARDS-1>
END = "job/"  # the first RowKey after the job's own range [JOB_ROW, END)
SHARDS = 16  # counter rows per job: 16 writers at once conflict 1/16 as often as on one row
# The recheck window (M), for a job whose counter rows have no targets (``targets``: one written before them,
# or re-run). A finisher's view of the counters is as old as its read: others' finishes since are not in it.
# So a finisher whose own view (with its own finish) is within RECHECK_WINDOW of the total reads the job's
# range again after its commit; the one that commits last then sees the total, unless more than
# RECHECK_WINDOW finishes were in flight in its window, and then the reconciler's pass closes the job.
RECHECK_WINDOW = 64
JOB_RANGE = "PartitionKey eq @pk and RowKey ge @job and RowKey lt @end"
SHARD_ROWS = "PartitionKey eq @pk and ( RowKey lt @job or RowKey ge @end )"  # the SDK wants a space after @x
FIGURES = ("shards_done", "shards_failed", "spent_usd", "failed_shards")  # what counter rows add to


def tally(shard_ids: Iterable[str], counts: list[int] | None = None) -> list[int]:
    """How many of ``shard_ids`` each counter row counts, in row order, added to ``counts`` (a running tally);
    written comma-separated as the job row's ``counter_targets`` when ingest accepts the job."""
    counts = counts or [0] * SHARDS
    for sid in shard_ids:
        counts[index(sid)] += 1
    return counts


def targets(job: JobRow) -> list[int] | None:
    """Each counter row's count at the job's end, where this view can rely on it: the job row names them for
    every one of its shards, and its own figures count none (a re-run folds counted shards into the job
    row, and then a counter row's count no longer says which of its shards are left). None otherwise."""
    try:
        counts = [int(c) for c in job.counter_targets.split(",")] if job.counter_targets else []
    except ValueError:
        return None
    base = job.base or {"shards_done": job.shards_done, "shards_failed": job.shards_failed}
    if len(counts) != SHARDS or sum(counts) != job.shards_total or \
            int(base.get("shards_done") or 0) + int(base.get("shards_failed") or 0):
        return None
    return counts


def range_params(job_id: str) -> dict[str, str]:
    """The parameters of ``JOB_RANGE`` and ``SHARD_ROWS`` for one job."""
    return {"pk": job_id, "job": names.JOB_ROW, "end": END}


def index(shard_id: str, shards: int | None = None) -> int:
    """The number of the counter row a shard counts on: a stable hash of its id over ``shards`` (default
    ``SHARDS``) rows."""
    return zlib.crc32(shard_id.encode()) % (shards or SHARDS)


def key(shard_id: str, shards: int | None = None) -> str:
    """The counter row a shard counts on (its RowKey; ``index``)."""
    return f"{PREFIX}{index(shard_id, shards):02d}"


def in_job_range(row_key: str) -> bool:
    """Whether a RowKey is the job row or one of its counter rows (never a shard row)."""
    return names.JOB_ROW <= row_key < END


@dataclass(frozen=True)
class Counter:
    """One counter row: the finishes it counted, what they cost, and its first failed shard ids."""

    key: str
    done: int = 0
    failed: int = 0
    spent_usd: float = 0.0
    failed_shards: str = ""
    etag: str = ""  # "" for a row not yet written: the finish creates it

    @classmethod
    def from_entity(cls, entity: Any) -> Counter:
        meta = getattr(entity, "metadata", None) or {}
        return cls(key=str(entity["RowKey"]), done=int(entity.get("done") or 0),
                   failed=int(entity.get("failed") or 0), spent_usd=float(entity.get("spent_usd") or 0.0),
                   failed_shards=str(entity.get("failed_shards") or ""), etag=str(meta.get("etag") or ""))

    def failed_ids(self) -> list[str]:
        return [s for s in self.failed_shards.split(",") if s]

    def bumped(self, succeeded: bool, cost_usd: float, failed_id: str = "") -> Counter:
        """This row after one more finish (``failed_id``: a failed shard to name, when there is room)."""
        ids = self.failed_ids()
        if failed_id and len(ids) < FAILED_KEPT:
            ids.append(failed_id)
        return replace(self, done=self.done + succeeded, failed=self.failed + (not succeeded),
                       spent_usd=self.spent_usd + cost_usd, failed_shards=",".join(ids))

    def fields(self) -> dict[str, Any]:
        return {"done": self.done, "failed": self.failed, "spent_usd": self.spent_usd,
                "failed_shards": self.failed_shards}


def summed(entities: Iterable[Any]) -> JobRow | None:
    """The job from its range (the job row and its counter rows, in any order): the job row's own figures
    plus its counters', each counter kept with its ETag (``JobRow.counters``) and the job row's own figures
    kept apart (``JobRow.base``, what ``to_entity`` writes). None when the range holds no job row."""
    job, counters = None, []
    for entity in entities:
        if entity["RowKey"] == names.JOB_ROW:
            job = JobRow.from_entity(entity)
        elif in_job_range(str(entity["RowKey"])):
            counters.append(Counter.from_entity(entity))
    return None if job is None else with_counters(job, counters)


def with_counters(job: JobRow, counters: Iterable[Counter]) -> JobRow:
    """``job`` (its own figures in ``base`` when it has them, else its fields) summed with ``counters``."""
    base = job.base or {f: getattr(job, f) for f in FIGURES}
    held = tuple(sorted(counters, key=lambda c: c.key))
    failed = [s for s in str(base["failed_shards"]).split(",") if s]
    for c in held:
        failed += c.failed_ids()
    return replace(job, counters=held, base=dict(base),
                   shards_done=int(base["shards_done"]) + sum(c.done for c in held),
                   shards_failed=int(base["shards_failed"]) + sum(c.failed for c in held),
                   spent_usd=float(base["spent_usd"]) + sum(c.spent_usd for c in held),
                   failed_shards=",".join(failed[:FAILED_KEPT]))


def counter(job: JobRow, row_key: str) -> Counter:
    """The counter row ``row_key`` as ``job`` holds it (an unwritten one when it holds none)."""
    return next((c for c in job.counters if c.key == row_key), Counter(row_key))


def replaced(job: JobRow, new: Counter | None, row_key: str) -> JobRow:
    """``job`` with its counter ``row_key`` as now known: ``new``, or gone (None)."""
    rest = [c for c in job.counters if c.key != row_key]
    return with_counters(job, [*rest, new] if new is not None else rest)


def ended(job: JobRow) -> int:
    """Shards counted as ended (succeeded or failed) in this view of the job."""
    return job.shards_done + job.shards_failed


def complete(job: JobRow) -> bool:
    """Every shard is counted and the job has not ended: the job's close is owed."""
    return not job.terminal and ended(job) >= max(job.shards_total, 1)


def final_state(job: JobRow) -> JobState:
    """The terminal state of a job whose every shard is counted."""
    if job.shards_failed == 0:
        return JobState.SUCCEEDED
    return JobState.FAILED if job.shards_done == 0 else JobState.PARTIALLY_FAILED
