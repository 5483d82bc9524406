"""Where jobs stand, read from the job's counters: what it costs grows with the open work, not with the shards.

``job_status`` reads the job row (its counters: ``shards_done``, ``shards_failed``, ``shards_total``, the
first failed shard ids), the node rows of its pool (which agents hold which of its shards: bounded by the
pool's size) and the failed shards it names (at most ``FAILED_KEPT`` point reads); never the job's shard
rows, so a job of 100,000 shards answers as fast as one of ten. ``shard_page`` pages through the shard rows
for the detail views (the dashboard's job view, ``upwell status --json`` callers), a range query each.
``list_jobs`` reads the ledger's index: the open jobs and the latest ended, never a table scan.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from upwell.after.view import after_view
from upwell.ledger import JobRow, JobState, Ledger, ShardRow
from upwell.nodelog import NodeLog
from upwell.results import points
from upwell.storage import Storage

JOB_FIELDS = ("name", "status", "payload", "pool", "shards_total", "shards_done", "shards_failed", "spent_usd",
              "estimate_usd", "budget_usd", "created_at", "finished_at", "message", "reported", "report_blob",
              "source_blob", "quarantine_blob", "owner", "project")
PAGE = 100  # shard rows per page of a detail view


def _fields(job: JobRow) -> dict:
    out = {k: getattr(job, k) for k in JOB_FIELDS}
    out["status"] = job.status.value
    return out


def counts(job: JobRow, running: int) -> dict[str, int]:
    """Shards by state from the job's counters and the shards its pool's agents hold (``running``): those
    not counted, not running, are queued, or cancelled once the job is (their rows say which, page by page)."""
    total = job.shards_total
    ended = job.shards_done + job.shards_failed
    running = min(running, max(0, total - ended))
    rest = max(0, total - ended - running)
    cancelled = rest if job.status == JobState.CANCELLED else 0
    return {"queued": rest - cancelled, "running": running, "succeeded": job.shards_done,
            "failed": job.shards_failed, "cancelled": cancelled, "total": total}


def holders(storage: Storage, job: JobRow) -> dict[str, list[str]]:
    """node -> the job's shards it holds, as the pool's agents last beat (one partition read)."""
    prefix = f"{job.job_id}/"
    out: dict[str, list[str]] = {}
    for row in NodeLog(storage).nodes(job.pool) if job.pool else []:
        mine = [s[len(prefix):] for s in row.shards if s.startswith(prefix)]
        if mine:
            out[row.node] = mine
    return out


def job_status(storage: Storage, job_id: str, ledger: Ledger | None = None) -> dict | None:
    """The job's fields, its shards by state, the nodes running them and its first failures; None when
    there is no such job. Reads one job row, one node partition and the failed shards the row names."""
    ledger = ledger or Ledger(storage)
    job = ledger.job(job_id)
    if job is None:
        return None
    held = holders(storage, job) if job.status != JobState.REJECTED else {}
    out = {"job_id": job_id, **_fields(job), "shards": counts(job, sum(len(v) for v in held.values())),
           "workers": sorted(held)}
    if (done := points.progress(job)) is not None:  # a job of blocks: points done of points total
        out["points"] = done
    out["failures"] = [{"shard": s.shard_id, "error": s.error} for s in _failed(ledger, job)]
    out.update(after_view(ledger, job))  # its chain, analysis and notifications (upwell.after)
    return out


def _failed(ledger: Ledger, job: JobRow) -> list[ShardRow]:
    ids = job.failed_ids()
    if not ids:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(ids)), thread_name_prefix="status") as pool:
        rows = list(pool.map(lambda sid: ledger.shard(job.job_id, sid), ids))
    return [r for r in rows if r is not None]


def shard_page(storage: Storage, job_id: str, after: str = "", limit: int = PAGE,
               ledger: Ledger | None = None) -> tuple[list[ShardRow], str]:
    """One page of the job's shard rows after shard id ``after``, and the cursor of the next ("" at the end)."""
    return (ledger or Ledger(storage)).shard_page(job_id, after, limit)


def list_jobs(storage: Storage, ledger: Ledger | None = None, limit: int = 200) -> list[dict]:
    """The open jobs and the latest ended (``limit`` in all), newest first, through the ledger's index."""
    ledger = ledger or Ledger(storage)
    return [{"job_id": j.job_id, **_fields(j)} for j in ledger.recent_jobs(limit)]
