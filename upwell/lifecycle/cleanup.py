"""Delete a job's blobs and rows (``upwell delete``), and every ended job older than an age (``upwell prune``).

A job's blobs: shards/<job>/, checkpoints/<job>/, results/<job>/, reports/<job>/, its upload in
incoming/ (only while it is the same upload: a newer blob under the same name stays) and, for a
rejected job, its quarantined copy and error file. A manifest's data/ inputs are left: other jobs
may name them. Jobs still queued or running are refused unless ``force`` (which cancels them first).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from upwell import logs, names
from upwell.errors import Conflict, NotFound, UpwellError
from upwell.ingest.quarantine import ERROR_SUFFIX
from upwell.ledger import TERMINAL_JOB, JobRow, JobState, Ledger
from upwell.storage import Storage, split_path
from upwell.timeutil import parse_iso

log = logs.get("upwell.lifecycle.cleanup")
ENDED_JOB = (*TERMINAL_JOB, JobState.CANCELLED)
_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


@dataclass(frozen=True)
class Deleted:
    job_id: str
    blobs: int
    rows: int


def parse_age(text: str) -> timedelta:
    """'30d', '12h', '90m', '45s', '2w' -> timedelta."""
    m = _AGE.match(text or "")
    if not m:
        raise UpwellError(f"age {text!r} is not a number and a unit s, m, h, d or w (e.g. 30d)")
    return timedelta(seconds=float(m[1]) * _UNIT_S[m[2]])


def delete_prefix(storage: Storage, container: str, prefix: str, *, exact: bool = False) -> int:
    names_ = [prefix] if exact else [b.name for b in storage.list(container, prefix)]
    n = 0
    for name in names_:
        try:
            storage.delete(f"{container}/{name}")
            n += 1
        except NotFound:
            pass
    return n


@dataclass(frozen=True)
class Plan:
    """What ``delete_job`` would remove: each place (a prefix or a blob) with its blob count, and the rows."""

    job_id: str
    status: str
    places: tuple[tuple[str, int], ...]
    rows: int

    @property
    def blobs(self) -> int:
        return sum(n for _, n in self.places)


def plan_delete(storage: Storage, job_id: str, *, force: bool = False, ledger: Ledger | None = None) -> Plan:
    """What deleting ``job_id`` would remove, read and changed nothing (``upwell delete`` shows it first);
    refused as ``delete_job`` refuses it."""
    ledger = ledger or Ledger(storage)
    job = _deletable(ledger, job_id, force)
    places = [(f"{c}/{job_id}/", sum(1 for _ in storage.list(c, f"{job_id}/")))
              for c in (names.SHARDS, names.CHECKPOINTS, names.RESULTS, names.REPORTS)]
    if job.source_blob.startswith(f"{names.INCOMING}/") and job.source_etag:
        places.append((job.source_blob, 1))
    places += [(p, 1) for p in filter(None, [job.quarantine_blob]) for p in (p, f"{p}{ERROR_SUFFIX}")]
    return Plan(job_id, job.status.value, tuple(places), 1 + len(ledger.shards(job_id)))


def delete_job(storage: Storage, job_id: str, *, force: bool = False, ledger: Ledger | None = None) -> Deleted:
    ledger = ledger or Ledger(storage)
    job = _deletable(ledger, job_id, force)
    if job.status not in ENDED_JOB:
        from upwell.lifecycle.cancel import cancel_job

        cancel_job(storage, job_id, wait_s=30.0, ledger=ledger)
    blobs = sum(delete_prefix(storage, c, f"{job_id}/")
                for c in (names.SHARDS, names.CHECKPOINTS, names.RESULTS, names.REPORTS))
    blobs += _delete_upload(storage, job)
    for path in filter(None, [job.quarantine_blob]):
        for p in (path, f"{path}{ERROR_SUFFIX}"):
            container, name = split_path(p)
            blobs += delete_prefix(storage, container, name, exact=True)
    rows = ledger.delete_job(job_id)
    log.info("delete.done", job_id=job_id, blobs=blobs, rows=rows)
    return Deleted(job_id, blobs, rows)


def _deletable(ledger: Ledger, job_id: str, force: bool) -> JobRow:
    """The job row; UpwellError when there is none, or it is still queued or running and not ``force``."""
    job = ledger.job(job_id)
    if job is None:
        raise UpwellError(f"no such job {job_id}")
    if job.status not in ENDED_JOB and not force:
        raise UpwellError(f"job {job_id} is {job.status.value}; `upwell cancel` it first, "
                          "or delete with --force (which cancels it)")
    return job


def _delete_upload(storage: Storage, job: JobRow) -> int:
    source, etag = job.source_blob, job.source_etag
    if not source.startswith(f"{names.INCOMING}/") or not etag:
        return 0
    try:
        storage.delete(source, etag=etag)
        return 1
    except (NotFound, Conflict):
        return 0  # gone already, or a newer upload under the same name: that one is not this job's


def prune_candidates(storage: Storage, older_than: timedelta, *, now: datetime | None = None,
                     ledger: Ledger | None = None) -> list[JobRow]:
    """Ended jobs whose end (or creation, if no end was recorded) is older than ``older_than``."""
    ledger = ledger or Ledger(storage)
    cutoff = (now or datetime.now(UTC)) - older_than
    out = []
    for row in ledger.jobs(*ENDED_JOB, ended_before=cutoff, at_once=16):  # the catalogue's end, confirmed below
        when = parse_iso(row.finished_at or row.cancelled_at or row.created_at)
        if when is not None and when < cutoff:
            out.append(row)
    return sorted(out, key=lambda r: r.created_at)


def prune(storage: Storage, older_than: timedelta, *, dry_run: bool = False, now: datetime | None = None,
          ledger: Ledger | None = None) -> list[Deleted]:
    ledger = ledger or Ledger(storage)
    rows = prune_candidates(storage, older_than, now=now, ledger=ledger)
    if dry_run:
        return [Deleted(r.job_id, 0, 0) for r in rows]
    return [delete_job(storage, r.job_id, ledger=ledger) for r in rows]
