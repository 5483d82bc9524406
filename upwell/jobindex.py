"""The index of open jobs: Table `jobindex`, written and read only by the ledger (upwell.ledger).

Why it exists: a query of the `jobs` table that names no PartitionKey is a *table scan*; the service
reads every entity of the table to answer it, however few match, page after page of continuation
tokens. Only a point query (PartitionKey and RowKey) and a range query (one PartitionKey, a RowKey
range) read just what they return (Azure Storage, "Design for querying" and "Table design patterns:
index entities pattern", learn.microsoft.com/azure/storage/tables/table-storage-design-for-query and
.../table-storage-design-patterns). The scale timer runs every 30 s and the dashboard on every refresh;
through this index they read one RowKey range of one partition and then each open job by its keys, so
what they read grows with the open work, never with every job ever run.

Layout: one partition, ``PARTITION``. RowKey ``open-<job id>`` for each job that has not ended
(ingesting, waiting, accepted, running); RowKey ``ended-<inverted ms>-<job id>`` for each job that
ended (terminal, or cancelled), newest first, so the latest N are the first N of the range and the jobs
that ended in the last minutes are its head (``ended_since``: the scale timer's report fallback). ('/'
may not appear in a key: the separator is '-'.)

Partition ``catalog`` of the same table is the job catalogue (upwell.jobcatalog): one entity per job
with the fields listings filter on, which every listing of job rows reads instead of scanning `jobs`.
``moved`` writes the job's status there too, so the catalogue's status follows the index's.

The index is a hint that the job rows confirm: the ledger reads each job row it names and mends what
it finds stale (``mend``): an open entry of an ended job moves to ended, one whose job row never came
(a crash between the two writes) goes after ``GRACE_S``, with its catalogue entity. An ended entry of a
deleted job goes when a reader meets it.

An open job without an open entry cannot come about by the order of writes (upwell.ledger): a status
that opens a job (its creation, a re-run) is indexed *before* its row is written, so a crash leaves at
worst an entry that its row contradicts, which a reader mends; a status that ends a job is indexed
*after* its row, so a crash leaves an open entry of an ended job, which a reader moves to ended. Jobs
older than the index and the catalogue are indexed once, by the backfill (``add_missing``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from azure.core.exceptions import AzureError, ResourceNotFoundError

from upwell import names
from upwell.jobcatalog import ENDED_STATES, NOTED, JobCatalog
from upwell.rows import JobRow, JobState
from upwell.storage import Storage, storage_error

__all__ = ["ENDED", "ENDED_STATES", "GRACE_S", "OPEN", "PARTITION", "Entry", "JobIndex"]

PARTITION = "jobs"
OPEN, ENDED = "open-", "ended-"
_AFTER = {OPEN: "open.", ENDED: "ended."}  # '.' sorts right after '-': the end of each RowKey range
GRACE_S = 600.0  # an open entry with no job row is a crash between the two writes only after this long


def _inverted(epoch_s: float) -> str:
    """Milliseconds counted down from a far future, fixed width: later times sort first."""
    return f"{10**13 - int(epoch_s * 1000):013d}"


@dataclass(frozen=True)
class Entry:
    """One index entity: the job it names, its RowKey, and when the service last wrote it."""

    job_id: str
    row_key: str
    written: datetime | None


class JobIndex:
    """Keeps only a TableClient, and the catalogue (upwell.jobcatalog) in its own partition of the same table.
    Every SDK error leaves as an upwell error (upwell.storage.storage_error)."""

    def __init__(self, storage: Storage):
        self.table = storage.table(names.JOB_INDEX_TABLE)
        self.catalog = JobCatalog(self.table)

    # -- writes: the ledger calls ``moved`` with every job status it writes ------------------------
    def created(self, row: JobRow, was: JobState | None = None) -> None:
        """A job row about to be written for the first time: its catalogue entity and its index entry.
        ``was``: the status just indexed for a row that turned out to exist (``row``, a redelivery): its
        entity is put back, its entry written only if its status differs."""
        self.catalog.add(row)
        if row.status != was:
            self.moved(row.job_id, row.status, catalog=False)

    def moved(self, job_id: str, status: JobState | str, *, catalog: bool = True) -> None:
        """Index the job as its new status says: an open entry, or an ended one (and no open entry); the
        catalogue's status with it (unless ``catalog`` is False: the caller has just written it)."""
        if JobState(status) in ENDED_STATES:
            self.ended(job_id, status, catalog=catalog)
            return
        self._write({"PartitionKey": PARTITION, "RowKey": OPEN + job_id, "job_id": job_id})
        if catalog:
            self.catalog.note(job_id, {"status": status})

    def before_write(self, job_id: str, fields: dict[str, Any]) -> None:
        """Before a job-row write of ``fields``: index a status that opens the job (a crash before the row
        leaves an entry its row contradicts, which a reader mends; never an open job without an entry)."""
        if "status" in fields and JobState(fields["status"]) not in ENDED_STATES:
            self.moved(job_id, fields["status"])

    def after_write(self, job_id: str, fields: dict[str, Any]) -> None:
        """After a job-row write of ``fields``: index a status that ends the job (a crash before this leaves
        an open entry of an ended job, which a reader moves to ended), and carry the catalogue's other
        fields among ``fields`` (none: no request)."""
        ends = "status" in fields and JobState(fields["status"]) in ENDED_STATES
        if ends:
            self.ended(job_id, fields["status"], catalog=False)
        self.catalog.note(job_id, {k: v for k, v in fields.items() if k in NOTED or (ends and k == "status")})

    def ended(self, job_id: str, status: JobState | str, *, catalog: bool = True) -> None:
        """The job ended in ``status`` (terminal, or cancelled): its ended entry, its catalogue status."""
        now = time.time()
        # the ended entry first: a crash between the two leaves an open entry that a reader mends
        self._write({"PartitionKey": PARTITION, "RowKey": f"{ENDED}{_inverted(now)}-{job_id}", "job_id": job_id})
        if catalog:
            self.catalog.note(job_id, {"status": status}, at=now)
        self.forget(job_id)

    def forget(self, job_id: str, row_key: str | None = None) -> None:
        """Delete the job's open entry (or the entry ``row_key``); one already gone is fine."""
        try:
            self.table.delete_entity(PARTITION, row_key or OPEN + job_id)
        except ResourceNotFoundError:
            pass
        except AzureError as exc:
            raise storage_error(exc, f"unindex job {job_id}") from None

    def _write(self, entity: dict) -> None:
        try:
            self.table.upsert_entity(entity)
        except AzureError as exc:
            raise storage_error(exc, f"index job {entity['job_id']}") from None

    # -- reads -------------------------------------------------------------------------------------
    def open_entries(self) -> list[Entry]:
        """Every open entry: one RowKey range of one partition."""
        return list(self._range(OPEN))

    def ended_entries(self, limit: int) -> list[Entry]:
        """The ``limit`` latest ended entries: the first page of their range, and no more."""
        return list(self._range(ENDED, per_page=limit)) if limit > 0 else []

    def ended_since(self, seconds: float) -> list[Entry]:
        """The entries of the jobs that ended in the last ``seconds``: the head of the ended range."""
        return list(self._range(ENDED, hi=f"{ENDED}{_inverted(time.time() - seconds)}"))

    def _range(self, prefix: str, per_page: int | None = None, hi: str | None = None) -> Iterable[Entry]:
        flt = "PartitionKey eq @pk and RowKey ge @lo and RowKey lt @hi"
        params = {"pk": PARTITION, "lo": prefix, "hi": hi or _AFTER[prefix]}
        try:
            pages = self.table.query_entities(flt, parameters=params, results_per_page=per_page).by_page()
            for page in pages:
                yield from (Entry(str(e.get("job_id") or ""), e["RowKey"], e.metadata.get("timestamp"))
                            for e in page)
                if per_page:
                    return
        except AzureError as exc:
            raise storage_error(exc, "read the index of open jobs") from None

    # -- repair ------------------------------------------------------------------------------------
    def mend(self, entry: Entry, status: JobState | None) -> None:
        """Put right an entry that its job row (``status``; None: no row) contradicts."""
        if entry.row_key.startswith(ENDED):
            if status is None:  # the job was deleted (upwell.lifecycle cleanup)
                self.forget(entry.job_id, entry.row_key)
        elif status is not None:
            self.moved(entry.job_id, status)
        elif entry.written is None or (datetime.now(UTC) - entry.written).total_seconds() > GRACE_S:
            self.forget(entry.job_id, entry.row_key)
            self.catalog.forget(entry.job_id)  # written before the row that never came

    def open_jobs(self, read: Callable[[str], JobRow | None]) -> list[JobRow]:
        """The job rows (``read`` by id) of the open entries; an entry that its row contradicts is mended."""
        rows = []
        for entry in self.open_entries():
            job = read(entry.job_id)
            if job is None or job.status in ENDED_STATES:
                self.mend(entry, job.status if job else None)
            else:
                rows.append(job)
        return rows

    def ended_jobs(self, read: Callable[[str], JobRow | None], within_s: float) -> list[JobRow]:
        """The rows of the jobs that ended in the last ``within_s`` seconds (a deleted one is mended)."""
        rows: dict[str, JobRow] = {}
        for entry in self.ended_since(within_s):
            if entry.job_id in rows:  # ended twice (a re-run in between): one row
                continue
            job = read(entry.job_id)
            if job is None:
                self.mend(entry, None)
            else:
                rows[job.job_id] = job
        return list(rows.values())

    def recent_jobs(self, read: Callable[[str], JobRow | None], limit: int) -> list[JobRow]:
        """The open jobs and the ``limit`` that ended last, newest created first (at most ``limit`` rows)."""
        rows = {j.job_id: j for j in self.open_jobs(read)}
        for entry in self.ended_entries(limit):
            job = rows.get(entry.job_id) or read(entry.job_id)
            if job is None:
                self.mend(entry, None)
            else:
                rows[job.job_id] = job
        return sorted(rows.values(), key=lambda j: j.created_at, reverse=True)[:limit]

    def last_ended(self, read: Callable[[str], JobRow | None], limit: int) -> Iterator[JobRow]:
        """The rows of the jobs of the ``limit`` latest ended entries (one range read), newest first. Each row
        is ``read`` as the caller asks for it: a caller that stops early reads no more. A deleted job's entry
        is mended; a job that ended twice comes once."""
        seen: set[str] = set()
        for entry in self.ended_entries(limit):
            if entry.job_id in seen:
                continue
            seen.add(entry.job_id)
            job = read(entry.job_id)
            if job is None:
                self.mend(entry, None)
            else:
                yield job

    def add_missing(self, open_jobs: Iterable[JobRow]) -> int:
        """Add an open entry for each of these open jobs (rows just read) that has none (their catalogue
        entities are written already); how many were added."""
        have = {e.job_id for e in self.open_entries()}
        added = [j for j in open_jobs if j.job_id not in have and j.status not in ENDED_STATES]
        for job in added:
            self.moved(job.job_id, job.status, catalog=False)
        return len(added)
