"""A job's counts on Table `jobs`: read the job with its counter rows, finish a shard, close the job once.

The counter rows and their sums are ``upwell.counters``. Here is what the ledger does with them:

* ``read``: the job is ONE range query of its partition (RowKey ge ``job``, lt ``job/``), the job row
  and its counter rows, summed.
* ``finish``: a shard's final transition and its count are ONE entity-group transaction of the shard row
  and the counter row its id hashes to, both conditional (If-Match on the ETags the caller holds; a counter
  row not yet written is inserted, and a concurrent insert fails the transaction with 409). A shard is
  counted exactly once: its row's ETag guards the move to terminal. When the transaction fails, the
  service names the failing operation (the response's message starts ``<index>:``, which the SDK exposes as
  ``TableTransactionError.index``: learn.microsoft.com/rest/api/storageservices/
  performing-entity-group-transactions, azure-data-tables ``_error.TableTransactionError``), and only
  that row is read again; for a job with counter targets (below), a stale counter row reads the whole range
  again instead (one request all the same), so that the job row the targets are judged by is fresh too.
* ``close``: the job's terminal status is written ONCE: by whoever sees every shard counted while the job
  has not ended, in one transaction conditional on the job row and every counter row it read, which also
  folds the counters into the job row and deletes them. A second closer's transaction fails its condition;
  it reads the range again and finds the job ended. The winner alone gets ``Completion.job_done`` (and so
  requests the report).

Why a finisher may not see the total: it counts on one counter row and its view of the others is as old
as its read. But its own row's count is exact after its commit (the write was conditional on the row as it
held it), and ingest writes on the job row how many shards each counter row counts by the end
(``counters.targets``). So only the finisher that completes its row reads the range again after its commit:
the last row to complete is completed after every other, and its finisher's read sees every row complete and
closes the job. That is at most ``counters.SHARDS`` reads a job, with any number of collecting processes.
A finish that inserted its counter row (one its view did not hold) also reads again within the window below:
the row may be new since a fold that the view, read before it, does not know of.
A job without targets (written before them, or re-run: the fold counts shards on the job row) falls back to
a window: a finisher whose view (its own finish included) is within ``counters.RECHECK_WINDOW`` (M) of the
total reads the range again; the last to commit sees the total unless more than M finishes committed
between its read and its commit, and then the reconciler's pass over open jobs (``upwell.ops.reconcile``)
closes it, through the same ``close``, within one reconcile period. A finish on a job that has already
ended counts on the job row itself, as before counter rows (an ended job keeps no counter rows).

Every SDK error leaves as an upwell error (``upwell.storage.storage_error``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError, ResourceModifiedError, ResourceNotFoundError
from azure.data.tables import TableClient, TableTransactionError, UpdateMode

from upwell import counters, names
from upwell.counters import Counter
from upwell.errors import TransientError
from upwell.jobindex import JobIndex
from upwell.rows import TERMINAL_SHARD, JobRow, ShardRow, ShardState
from upwell.storage import funnel
from upwell.timeutil import now_iso

RETRIES = 20
_COND = {"mode": UpdateMode.MERGE, "match_condition": MatchConditions.IfNotModified}


@dataclass(frozen=True)
class Completion:
    """What finishing one shard did to its job."""

    counted: bool  # False: the shard was already terminal (a duplicate)
    job_done: bool  # True for exactly one caller per job
    job_status: str
    view: JobRow | None = None  # the finisher's view after its commit, to try the next finish on (jobviews)


def conflict(exc: Exception) -> bool:
    """Another writer got there first: a condition failed (412), an insert met a row (409), or, inside a
    transaction, a row it expected was deleted meanwhile (404: a counter row folded into the job row)."""
    if isinstance(exc, ResourceModifiedError):
        return True
    codes = (404, 409, 412) if isinstance(exc, TableTransactionError) else (409, 412)
    return isinstance(exc, HttpResponseError) and exc.status_code in codes


_funnel = funnel  # every SDK error leaves as an upwell error (upwell.storage)


class JobCounts:
    """Reads and finishes against one TableClient; keeps the index of open jobs to mark a closed job ended."""

    def __init__(self, table: TableClient, index: JobIndex):
        self.table, self.index = table, index

    def read(self, job_id: str) -> JobRow | None:
        """The job row summed with its counter rows: one range query. None when the job has no row."""
        with _funnel(f"read job {job_id}"):
            return counters.summed(self.table.query_entities(counters.JOB_RANGE,
                                                             parameters=counters.range_params(job_id)))

    def finish(self, job_id: str, shard_id: str, status: ShardState, fields: dict, cost_usd: float, *,
               shard: ShardRow | None = None, job: JobRow | None = None) -> Completion:
        """Make a shard terminal and count it (see the module's text). ``shard``, ``job``: rows the caller
        holds, with their ETags, tried first; a stale one fails its condition and only it is read again."""
        if status not in TERMINAL_SHARD:
            raise ValueError(f"finish_shard: {status.value!r} is not a terminal shard state")
        view = job if job is not None and job.etag else None
        row = shard if shard is not None and shard.etag else None
        with _funnel(f"finish shard {job_id}/{shard_id}"):
            for attempt in range(RETRIES):
                view = view or self.read(job_id)
                row = row or self._shard(job_id, shard_id)
                if view is None or row is None:
                    return Completion(False, False, "")
                if row.terminal:
                    return Completion(False, False, view.status.value)
                target = self._target(view, row, status, cost_usd)
                try:
                    meta = self.table.submit_transaction([
                        ("update", {"PartitionKey": job_id, "RowKey": shard_id, "status": status.value, **fields},
                         {**_COND, "etag": row.etag}), target])
                except HttpResponseError as exc:
                    if not conflict(exc):
                        raise
                    view, row = self._stale(exc, view, row, target)
                    _back_off(attempt)
                    continue
                return self._counted(view, target, meta)
        raise TransientError(f"job {job_id}: too much contention finishing {shard_id}", code="Contention")

    def _shard(self, job_id: str, shard_id: str) -> ShardRow | None:
        try:
            return ShardRow.from_entity(self.table.get_entity(job_id, shard_id))
        except ResourceNotFoundError:
            return None

    @staticmethod
    def _target(view: JobRow, row: ShardRow, status: ShardState, cost_usd: float) -> tuple:
        """The transaction's second operation: the shard's counter row, bumped (inserted when unwritten), or
        the job row's own figures on a job that has ended (it keeps no counter rows)."""
        ok, failed_id = status == ShardState.SUCCEEDED, row.shard_id if status == ShardState.FAILED else ""
        if view.terminal:
            own = {**{f: getattr(view, f) for f in counters.FIGURES}, **view.base}
            after = Counter(names.JOB_ROW, own["shards_done"], own["shards_failed"], own["spent_usd"],
                            own["failed_shards"]).bumped(ok, cost_usd, failed_id)
            figures = dict(zip(counters.FIGURES, after.fields().values(), strict=True))
            return "update", {"PartitionKey": view.job_id, "RowKey": names.JOB_ROW, **figures}, \
                {**_COND, "etag": view.etag}
        now = counters.counter(view, counters.key(row.shard_id)).bumped(ok, cost_usd, failed_id)
        entity = {"PartitionKey": view.job_id, "RowKey": now.key, **now.fields()}
        return ("update", entity, {**_COND, "etag": now.etag}) if now.etag else ("create", entity)

    def _stale(self, exc: Exception, view: JobRow, row: ShardRow,
               target: tuple) -> tuple[JobRow | None, ShardRow | None]:
        """After a failed transaction, forget only the row the service named: the shard row (index 0), or the
        counter row (index 1: read just that row again; the job row when the job has ended)."""
        if getattr(exc, "index", 1) == 0:
            return view, None
        row_key = target[1]["RowKey"]
        if row_key == names.JOB_ROW or counters.targets(view) is not None:
            # a view whose targets decide who reads again must hold the job row as it is now (a fold since
            # would have moved counts onto it): the whole range again, one request like the row alone
            return None, row
        try:
            now: Counter | None = Counter.from_entity(self.table.get_entity(view.job_id, row_key))
        except ResourceNotFoundError:
            now = None
        if now is None and target[0] == "update":  # the row this view held is gone: the job was folded
            return None, row
        return counters.replaced(view, now, row_key), row

    def _counted(self, view: JobRow, target: tuple, meta: list) -> Completion:
        """The shard is counted: close the job when this view says it may be complete (read the range again
        first unless this view alone already shows every shard counted)."""
        if target[1]["RowKey"] == names.JOB_ROW:
            return Completion(True, False, view.status.value)
        etag = str(((meta or [{}, {}])[1] or {}).get("etag") or "")
        written = Counter.from_entity(_Written(target[1], etag))
        mine = counters.replaced(view, written, written.key)
        if not self._may_be_last(mine, written, created=target[0] == "create"):
            return Completion(True, False, view.status.value, mine if etag else None)
        seen = mine if counters.complete(mine) and etag else self.read(mine.job_id)
        if seen is None or not counters.complete(seen):  # not every shard is counted yet: no close is owed
            return Completion(True, False, view.status.value, seen)
        closed = self.close(mine.job_id, seen)
        return Completion(True, closed is not None, closed or view.status.value)

    @staticmethod
    def _may_be_last(mine: JobRow, written: Counter, created: bool) -> bool:
        """Whether this finish may be the job's last, so that the range must be read again after it. Exact
        where the job row names each counter row's target (``counters.targets``): the count just written is
        its row's own (the write was conditional on the row as held), so only the finish that completes its
        row may be the last, and the last row to complete is completed after every other, so its finisher's
        read sees them all: at most ``counters.SHARDS`` reads a job, whatever the number of processes.
        Without targets, the recheck window (``counters.RECHECK_WINDOW``). A ``created`` row (one the view did
        not hold: never written, or deleted by a fold that a view read before it misses, its job row then
        stale) also reads again within the window."""
        near = counters.ended(mine) >= mine.shards_total - counters.RECHECK_WINDOW
        goal = counters.targets(mine)
        if goal is None:
            return near
        row_done = written.done + written.failed >= goal[int(written.key.removeprefix(counters.PREFIX))]
        return row_done or (created and near)

    def close(self, job_id: str, seen: JobRow | None = None) -> str | None:
        """Write the job's terminal status if every shard is counted and it has not ended: the terminal
        state for the one caller whose write lands, None for everyone else. ``seen``: a view to try first
        (its ETags; no read)."""
        def change(job: JobRow) -> dict[str, Any] | None:
            if not counters.complete(job):
                return None
            return {"status": counters.final_state(job).value, "finished_at": now_iso()}

        fields = self.fold(job_id, change, seen)
        return None if fields is None else fields["status"]

    def fold(self, job_id: str, change: Callable[[JobRow], dict[str, Any] | None],
             seen: JobRow | None = None) -> dict[str, Any] | None:
        """Apply change(job) -> fields | None, ``job`` read with its counters summed, in one transaction that
        writes the sums as the job row's own figures (then ``fields``) and deletes the counter rows, all
        conditional on the ETags read: a finish or another writer in between fails it, and it reads again.
        The fields written, or None (no job, or nothing to change)."""
        with _funnel(f"update job {job_id}"):
            for _ in range(RETRIES):
                job = seen or self.read(job_id)
                seen = None
                fields = None if job is None else change(job)
                if job is None or fields is None:
                    return None
                fields = {k: v.value if isinstance(v, StrEnum) else v for k, v in fields.items()}
                figures = {f: getattr(job, f) for f in counters.FIGURES}
                ops: list[tuple] = [("update", {"PartitionKey": job_id, "RowKey": names.JOB_ROW, **figures, **fields},
                                     {**_COND, "etag": job.etag})]
                ops += [("delete", {"PartitionKey": job_id, "RowKey": c.key},
                         {"etag": c.etag, "match_condition": MatchConditions.IfNotModified}) for c in job.counters]
                self.index.before_write(job_id, fields)  # a status that opens the job: indexed before its row
                try:
                    self.table.submit_transaction(ops)
                except HttpResponseError as exc:
                    if not conflict(exc):
                        raise
                    continue
                self.index.after_write(job_id, fields)  # one that ends it: after (upwell.jobindex)
                return fields
        raise TransientError(f"job {job_id}: too much contention", code="Contention")


def _back_off(attempt: int) -> None:
    """A random wait that doubles with each lost race (to at most 0.16 s): writers that met on one row
    spread out rather than meet again (Azure Storage's guidance for a busy partition: exponential backoff)."""
    time.sleep(random.uniform(0, 0.005 * 2 ** min(attempt, 5)))


class _Written(dict):
    """An entity just written, with the ETag the service returned for it (what Counter.from_entity reads)."""

    def __init__(self, entity: dict, etag: str):
        super().__init__(entity)
        self.metadata = {"etag": etag}
