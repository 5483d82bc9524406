"""The ledger: Table `jobs`, one job row (RowKey "job"), its counter rows ("job.c00".., upwell.counters)
and one row per shard.

Every write that two workers can race on is ETag-conditional. A shard's final
transition and its count change in ONE entity-group transaction (they share the
PartitionKey) of the shard row and one counter row, so a shard is counted exactly
once; the job's end is one conditional write, so exactly one caller sees the job
become terminal (upwell.jobcounts).

Reads return typed rows (upwell.rows); every method raises only upwell errors
(TransientError, NotFound, Conflict, StorageError), each with the service's code.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from enum import StrEnum
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.data.tables import UpdateMode

from upwell import counters, jobcatalog, jobindex, names, shardbatch
from upwell.errors import TransientError
from upwell.jobcatalog import Listed
from upwell.jobcounts import Completion, JobCounts, conflict
from upwell.jobindex import JobIndex
from upwell.rows import (
    TERMINAL_JOB,
    TERMINAL_SHARD,
    JobRow,
    JobState,
    ShardRow,
    ShardState,
)
from upwell.storage import Storage, funnel
from upwell.timeutil import now_iso

__all__ = ["TERMINAL_JOB", "TERMINAL_SHARD", "Completion", "JobRow", "JobState", "Ledger", "ShardRow",
           "ShardState"]
_RETRIES = 20


_conflict = conflict  # the one test of "another writer got there first" (upwell.jobcounts)


_funnel = funnel  # every SDK error leaves as an upwell error (upwell.storage)


def _history(row: ShardRow, status: str, keep: int = 20) -> str:
    """The shard's earlier attempts (JSON), with the one ending now appended: node, started, finished, status."""
    past = row.attempts_history()
    past.append({"node": row.node, "started": row.started_at, "finished": now_iso(), "status": status})
    return json.dumps(past[-keep:])


_SHARD_ROWS = counters.SHARD_ROWS  # a job's partition less its own range: the job row and its counter rows


class Ledger:
    """Reads and writes job and shard rows. Keeps only a TableClient, and the index of open jobs
    (upwell.jobindex) that it writes with every job status."""

    def __init__(self, storage: Storage):
        self.table = storage.table(names.JOBS_TABLE)
        self.index = JobIndex(storage)
        self.counts = JobCounts(self.table, self.index)
        self.catalog = self.index.catalog  # what listings read (upwell.jobcatalog)

    # -- reads -----------------------------------------------------------------
    def job(self, job_id: str) -> JobRow | None:
        """The job row summed with its counter rows (upwell.counters): one range query of its partition."""
        return self.counts.read(job_id)

    def shard(self, job_id: str, shard_id: str) -> ShardRow | None:
        with _funnel(f"read shard {job_id}/{shard_id}"):
            try:
                return ShardRow.from_entity(self.table.get_entity(job_id, shard_id))
            except ResourceNotFoundError:
                return None

    def shards(self, job_id: str) -> list[ShardRow]:
        """The job's shard rows, in shard id order."""
        with _funnel(f"list shards of {job_id}"):
            rows = self.table.query_entities(_SHARD_ROWS, parameters=counters.range_params(job_id))
            return [ShardRow.from_entity(r) for r in rows]

    def shard_page(self, job_id: str, after: str = "", limit: int = 100) -> tuple[list[ShardRow], str]:
        """One page of the job's shard rows, in shard id order, after shard id ``after``: a range query
        (PartitionKey, RowKey greater than), which reads what it returns however many shards the job has.
        Returns the rows and the id to ask after for the next page ("" when this page was the last)."""
        limit = max(1, min(int(limit), 1000))
        rows: list[ShardRow] = []
        with _funnel(f"page shards of {job_id}"):
            pages = self.table.query_entities("PartitionKey eq @pk and RowKey gt @after", results_per_page=limit,
                                              parameters={"pk": job_id, "after": after}).by_page()
            for page in pages:
                rows += [ShardRow.from_entity(e) for e in page if not counters.in_job_range(e["RowKey"])]
                if len(rows) >= limit:
                    break
        rows = rows[:limit]
        return rows, rows[-1].shard_id if len(rows) == limit else ""

    def jobs(self, *statuses: JobState | str, created_since: str | None = None, ended_before: datetime | None = None,
             newest_first: bool = False, at_once: int = 1, **equal: str | list[str]) -> Iterator[JobRow]:
        """The job rows in any of ``statuses`` (all without), created at or after ``created_since`` (ISO
        text), ended before ``ended_before``, whose catalogue fields named in ``equal`` (``project=``,
        ``owner=``, ``payload=``, ``pool=``, ``name=``; a list: any of its values) hold those values: one
        query of the job catalogue (upwell.jobcatalog), never of the `jobs` table, then a point read of each
        job row as the caller asks for it, ``at_once`` at a time (upwell.jobcatalog ``listing``)."""
        found = self.catalog.entries(*statuses, created_since=created_since, ended_before=ended_before, **equal)
        if newest_first:
            found.sort(key=lambda e: e.created_at, reverse=True)
        return jobcatalog.listing(self.catalog, self.job, found, grace_s=jobindex.GRACE_S, at_once=at_once,
                                  keep=lambda j: jobcatalog.confirmed(j, statuses, created_since, equal))

    def listed(self, found: Iterable[Listed]) -> Iterator[JobRow]:
        """The job rows of catalogue entities (upwell.jobcatalog), each point-read as the caller asks."""
        return jobcatalog.listing(self.catalog, self.job, found, grace_s=jobindex.GRACE_S)

    def open_jobs(self, *statuses: JobState) -> list[JobRow]:
        """The jobs that have not ended (all of them, or those in ``statuses``), through the index of open
        jobs: one range read and one point read per open job, never a scan of the table (upwell.jobindex)."""
        return [j for j in self.index.open_jobs(self.job) if not statuses or j.status in statuses]

    def backfill_catalog(self) -> list[JobRow]:
        """Catalogue and index every job row (a job older than the catalogue): the one scan of `jobs`, run
        once by the reconciler's first pass after an upgrade. Returns the rows read."""
        rows = jobcatalog.backfill(self.table, self.catalog)
        self.index.add_missing(rows)
        return rows

    def ended_jobs(self, within_s: float) -> list[JobRow]:
        """The jobs that ended (terminal or cancelled) in the last ``within_s`` seconds, through the index:
        what a periodic pass reads grows with the recent work, not with every job ever run."""
        return self.index.ended_jobs(self.job, within_s)

    def recent_jobs(self, limit: int) -> list[JobRow]:
        """The open jobs and the ``limit`` that ended last, newest created first (at most ``limit`` rows)."""
        return self.index.recent_jobs(self.job, limit)

    def active_shards(self, job_id: str) -> list[tuple[str, str]]:
        """(claim's place, shard id) of the job's shards that an agent works on now (ShardRow.claimed_running)."""
        with _funnel(f"list running shards of {job_id}"):
            shards = [ShardRow.from_entity(r) for r in self.table.query_entities(
                f"{_SHARD_ROWS} and status eq @s", parameters={**counters.range_params(job_id),
                                                              "s": ShardState.RUNNING.value})]
        return [(s.claim_place, s.shard_id) for s in shards if s.claimed_running]

    def running(self, pool: str, among: list[JobRow] | None = None) -> list[ShardRow]:
        """Shard rows that are running on a pool (the ledger's in-flight count), read job by job (one
        partition each) from ``among`` (the pool's open jobs as the caller holds them; read through the
        index when not given): a scan of the whole table would grow with every job ever run."""
        jobs = [j for j in self.open_jobs() if j.pool == pool] if among is None else among
        out: list[ShardRow] = []
        with _funnel(f"list running shards of pool {pool}"):
            for job in jobs:
                rows = self.table.query_entities(f"{_SHARD_ROWS} and status eq @s and pool eq @p",
                                                 parameters={**counters.range_params(job.job_id),
                                                             "s": ShardState.RUNNING.value, "p": pool})
                out += [ShardRow.from_entity(r) for r in rows]
        return out

    # -- creation --------------------------------------------------------------
    def create_job(self, row: JobRow) -> tuple[JobRow, bool]:
        """Create the job row; if it exists (a redelivery), return the existing one. The index entry
        and catalogue entity come first: those left without their row are mended by the readers
        (upwell.jobindex); a redelivery puts back the held row's (its ``created_at`` stays)."""
        self.index.created(row)
        with _funnel("create job"):
            try:
                self.table.create_entity(row.to_entity())
                return row, True
            except ResourceExistsError:
                pass
        held = self.job(row.job_id) or row
        if held is not row:
            self.index.created(held, was=row.status)
        return held, False

    def add_shards(self, job_id: str, rows: list[ShardRow]) -> list[str]:
        """Create shard rows in entity-group transactions of 100, one at a time (Azurite reset connections
        under eight at once); rows that exist are left alone (upwell.shardbatch). Returns each row's ETag as
        this write left it, in order ("" for a row that existed): an agent's first claim is conditional on it."""
        with _funnel(f"add shards to {job_id}"):
            return shardbatch.create_or_delete(self.table, "create", [{**r.to_entity(), "PartitionKey": job_id}
                                                                      for r in rows])

    # -- transitions -----------------------------------------------------------
    def update_job(self, job_id: str, **fields: Any) -> None:
        """Merge ``fields`` into the job row, indexed around the write (upwell.jobindex ``before_write``)."""
        fields = {k: v.value if isinstance(v, JobState) else v for k, v in fields.items()}
        self.index.before_write(job_id, fields)
        with _funnel(f"update job {job_id}"):
            self.table.update_entity({"PartitionKey": job_id, "RowKey": names.JOB_ROW, **fields},
                                     mode=UpdateMode.MERGE)
        self.index.after_write(job_id, fields)

    def _update_shard(self, job_id: str, shard_id: str,
                      change: Callable[[ShardRow], dict[str, Any] | None]) -> dict | None:
        """Apply change(row) -> fields | None under ETag; None means leave as is."""
        return self._change_row(job_id, shard_id, ShardRow, change, f"shard {job_id}/{shard_id}")

    def _change_row(self, job_id: str, row_key: str, row_type: type[JobRow] | type[ShardRow],
                    change: Callable[[Any], dict[str, Any] | None], what: str) -> dict | None:
        """The one ETag-retry loop: read the row, apply change(row) -> fields | None, write the fields only
        if nobody wrote the row meanwhile, else read it again. None: no such row, or nothing to change."""
        with _funnel(f"update {what}"):
            for _ in range(_RETRIES):
                try:
                    entity = self.table.get_entity(job_id, row_key)
                except ResourceNotFoundError:
                    return None
                fields = change(row_type.from_entity(entity))
                if fields is None:
                    return None
                fields = {k: v.value if isinstance(v, StrEnum) else v for k, v in fields.items()}
                try:
                    self.table.update_entity({"PartitionKey": job_id, "RowKey": row_key, **fields},
                                             mode=UpdateMode.MERGE, etag=entity.metadata["etag"],
                                             match_condition=MatchConditions.IfNotModified)
                    return fields
                except (ResourceModifiedError, HttpResponseError) as exc:
                    if not _conflict(exc):
                        raise
        raise TransientError(f"{what}: too much contention", code="Contention")

    def shard_started(self, job_id: str, shard_id: str, *, node: str, pool: str, attempt: int,
                      spot: bool = False, row: ShardRow | None = None, job: JobRow | None = None,
                      seen_only: bool = False) -> str | None:
        """Mark a shard running; "" (falsy) if it is already terminal (a duplicate delivery), else the
        shard row's new ETag ("?" when it is not known: after a conflict, the row was read again).

        ``row``: the shard row as the caller just read it; its ETag is tried first, so the usual case
        costs one conditional write and no read (a conflict falls back to read and retry). ``job``: the
        job row as the caller holds it; a job it shows running already is not read again to be marked.
        ``seen_only``: ``row`` is the row as its ETag says it was written (the work item's view of the row
        as ingest wrote it, workers.delivery): one conditional write and nothing else; None when the row
        has moved on since (412) or is gone (404), for the caller to read it and decide again."""
        def change(row: ShardRow):
            if row.terminal:
                return None
            # a re-claim of a shard still running (a duplicate delivery) keeps its place under the cap
            return {"status": ShardState.RUNNING.value, "node": node, "pool": pool, "spot": spot,
                    "attempts": attempt, "started_at": now_iso(),
                    "first_started_at": row.first_started_at or now_iso(), "released_at": "",
                    "claim_key": row.claim_place if row.claimed_running else ""}

        etag = self._update_seen(row, change) if row is not None and row.etag else None
        if etag is None and seen_only:
            return None
        if etag is None:  # no row given, or it moved on: read, change and write under ETag
            etag = "?" if self._update_shard(job_id, shard_id, change) is not None else ""
        if etag and (job is None or job.status != JobState.RUNNING):
            self._job_running(job_id, job)
        return etag

    def _update_seen(self, row: ShardRow, change: Callable[[ShardRow], dict[str, Any] | None]) -> str | None:
        """One ETag-conditional write of change(row) against the row as the caller saw it: the new ETag,
        "" when change declines, None when the row moved on since (read it again)."""
        fields = change(row)
        if fields is None:
            return ""
        with _funnel(f"update shard {row.job_id}/{row.shard_id}"):
            try:
                meta = self.table.update_entity({"PartitionKey": row.job_id, "RowKey": row.shard_id, **fields},
                                                mode=UpdateMode.MERGE, etag=row.etag,
                                                match_condition=MatchConditions.IfNotModified)
            except (ResourceModifiedError, ResourceNotFoundError, HttpResponseError) as exc:
                if isinstance(exc, ResourceNotFoundError) or _conflict(exc):
                    return None
                raise
        return str((meta or {}).get("etag") or "?")

    def _job_running(self, job_id: str, seen: JobRow | None = None) -> None:
        """accepted -> running. ``seen``: the caller's copy of the job row, tried first under its ETag."""
        with _funnel(f"mark job {job_id} running"):
            for attempt in range(2):
                if attempt == 0 and seen is not None and seen.etag:
                    status, etag = seen.status, seen.etag
                else:
                    try:
                        entity = self.table.get_entity(job_id, names.JOB_ROW)
                    except ResourceNotFoundError:
                        return
                    status, etag = entity.get("status"), entity.metadata["etag"]
                if status != JobState.ACCEPTED:
                    return
                try:
                    self.table.update_entity({"PartitionKey": job_id, "RowKey": names.JOB_ROW,
                                              "status": JobState.RUNNING.value, "started_at": now_iso()},
                                             mode=UpdateMode.MERGE, etag=etag,
                                             match_condition=MatchConditions.IfNotModified)
                    return
                except (ResourceModifiedError, HttpResponseError) as exc:
                    if not _conflict(exc):
                        raise
                    if attempt == 1 or seen is None:
                        return  # someone else moved it on
                    seen = None  # the caller's copy was stale: read it once

    def shard_preempted(self, job_id: str, shard_id: str, *, checkpoints: int, node_seconds: float) -> None:
        def change(row: ShardRow):
            if row.terminal:
                return None
            return {"status": ShardState.PREEMPTED.value, "preemptions": row.preemptions + 1,
                    "history": _history(row, "preempted"), "checkpoints": row.checkpoints + checkpoints,
                    "preempted_node_seconds": row.preempted_node_seconds + node_seconds}

        self._update_shard(job_id, shard_id, change)

    def shard_deferred(self, job_id: str, shard_id: str, *, node: str = "") -> None:
        """Count a delivery that was put back because the job is at its concurrency cap (not a
        failure). With ``node``: this node had marked it running, so it goes back to queued."""
        def change(row: ShardRow):
            if row.terminal:
                return None
            fields: dict[str, Any] = {"deferrals": row.deferrals + 1}
            if node and row.status == ShardState.RUNNING and row.node == node:
                fields["status"] = ShardState.QUEUED.value
            elif row.claimed_running:  # another agent runs it: this write must not move its claim's place
                fields["claim_key"] = row.claim_place
            return fields

        self._update_shard(job_id, shard_id, change)

    def shard_released(self, job_id: str, shard_id: str) -> None:
        """The agent is done with the shard (its result is written); collect will make it terminal."""
        def change(row: ShardRow):
            return {"released_at": now_iso()} if row.status == ShardState.RUNNING else None

        self._update_shard(job_id, shard_id, change)

    def shard_retry(self, job_id: str, shard_id: str, *, error: str, stderr_tail: str,
                    node_seconds: float) -> None:
        def change(row: ShardRow):
            if row.terminal:
                return None
            return {"status": ShardState.QUEUED.value, "error": error[:2000], "stderr_tail": stderr_tail[-4000:],
                    "history": _history(row, "failed"), "failures": row.failures + 1,
                    "failed_node_seconds": row.failed_node_seconds + node_seconds}

        self._update_shard(job_id, shard_id, change)

    def shard_cancelled(self, job_id: str, shard_id: str, *, node: str = "", checkpoints: int = 0) -> bool:
        """Make a shard "cancelled" (its job was cancelled). With ``node``: only while that node runs it."""
        def change(row: ShardRow):
            if row.terminal or (node and (row.status != ShardState.RUNNING or row.node != node)):
                return None
            fields: dict[str, Any] = {"status": ShardState.CANCELLED.value, "cancelled_at": now_iso()}
            if row.status == ShardState.RUNNING:
                fields["history"] = _history(row, "cancelled")
                fields["checkpoints"] = row.checkpoints + checkpoints
            return fields

        return self._update_shard(job_id, shard_id, change) is not None

    def reopen_shard(self, job_id: str, shard_id: str) -> ShardState | None:
        """Put an ended shard back to queued for a re-run; returns the state it had (None: it had not ended)."""
        was: list[ShardState] = []

        def change(row: ShardRow):
            if not row.terminal:
                return None
            was[:] = [row.status]
            return shardbatch.reopened(row, now_iso())

        return was[0] if self._update_shard(job_id, shard_id, change) is not None else None

    def cancel_shards(self, job_id: str, rows: list[ShardRow], workers: int = 4) -> int:
        """Cancel ``rows`` (read just now; not running, not ended) in transactions of 100; how many."""
        with _funnel(f"cancel shards of {job_id}"):
            return shardbatch.cancel(self, job_id, rows, now_iso(), workers)

    def reopen_shards(self, job_id: str, rows: list[ShardRow], workers: int = 4) -> dict[str, ShardState]:
        """Re-open the ended ``rows`` in transactions of 100; shard id -> the state each had."""
        with _funnel(f"reopen shards of {job_id}"):
            return shardbatch.reopen(self, job_id, rows, now_iso(), workers)

    def change_job(self, job_id: str, change: Callable[[JobRow], dict[str, Any] | None]) -> dict | None:
        """Apply change(row) -> fields | None to the job row under ETag, retrying on conflicts; indexed
        around each try's write (upwell.jobindex ``before_write``). ``row`` holds the job row's own figures,
        not summed with its counter rows: a writer of them uses change_counts."""
        def indexed(row: JobRow) -> dict[str, Any] | None:
            fields = change(row)
            self.index.before_write(job_id, fields or {})
            return fields

        fields = self._change_row(job_id, names.JOB_ROW, JobRow, indexed, f"job {job_id}")
        if fields:
            self.index.after_write(job_id, fields)
        return fields

    def delete_job(self, job_id: str) -> int:
        """Delete the job row and every shard row; returns how many rows went."""
        with _funnel(f"delete job {job_id}"):
            rows = list(self.table.query_entities("PartitionKey eq @pk", parameters={"pk": job_id},
                                                  select=["PartitionKey", "RowKey"]))
            self.index.forget(job_id)  # its ended entry goes when a reader meets it
            self.catalog.forget(job_id)
            shardbatch.create_or_delete(self.table, "delete", [{"PartitionKey": job_id, "RowKey": r["RowKey"]}
                                                               for r in rows], workers=8)
        return len(rows)

    def finish_shard(self, job_id: str, shard_id: str, status: ShardState | str, fields: dict, *,
                     cost_usd: float = 0.0, shard: ShardRow | None = None, job: JobRow | None = None) -> Completion:
        """Make a shard terminal and count it on one of its job's counter rows, atomically; the caller that
        sees every shard counted writes the job's end, once (upwell.jobcounts). ``shard``, ``job``: rows the
        caller already holds, with their ETags, tried first (a stale one fails its condition and is read again)."""
        return self.counts.finish(job_id, shard_id, ShardState(status), fields, cost_usd, shard=shard, job=job)

    def close_job(self, job_id: str) -> str | None:
        """End a job whose every shard is counted and that has not ended (what a finisher whose view was
        stale by more than the recheck window left open): its terminal state for the one caller that wrote
        it, None for everyone else (upwell.jobcounts)."""
        return self.counts.close(job_id)

    def change_counts(self, job_id: str, change: Callable[[JobRow], dict[str, Any] | None]) -> dict | None:
        """change_job for a writer of the job's figures (a re-run gives counts back): ``change`` sees them
        summed with the counter rows, and its fields are written with the counters folded into the job row."""
        return self.counts.fold(job_id, change)

    def claim_report(self, job_id: str, lease_s: float = 300.0) -> bool:
        """Claim the right to build the report; exactly one claimant wins per lease period."""
        job = self.job(job_id)
        if job is None or job.reported or not job.terminal or job.status == JobState.REJECTED:
            return False
        if job.report_claimed and time.time() - job.report_claimed < lease_s:
            return False
        with _funnel(f"claim report of {job_id}"):
            try:
                self.table.update_entity({"PartitionKey": job_id, "RowKey": names.JOB_ROW,
                                          "report_claimed": time.time()}, mode=UpdateMode.MERGE,
                                         etag=job.etag, match_condition=MatchConditions.IfNotModified)
                return True
            except (ResourceModifiedError, HttpResponseError) as exc:
                if _conflict(exc):
                    return False
                raise
