"""Where jobs stand: counts by shard state, workers, cost so far, and the pool's word."""

from __future__ import annotations

from collections import Counter

from upwell.after.view import after_view
from upwell.ledger import JobRow, JobState, Ledger, ShardState
from upwell.storage import Storage

JOB_FIELDS = ("name", "status", "payload", "pool", "shards_total", "shards_done", "shards_failed", "spent_usd",
              "estimate_usd", "budget_usd", "created_at", "finished_at", "message", "reported", "report_blob",
              "source_blob", "quarantine_blob", "owner", "project")


def _fields(job: JobRow) -> dict:
    out = {k: getattr(job, k) for k in JOB_FIELDS}
    out["status"] = job.status.value
    return out


def job_status(storage: Storage, job_id: str, ledger: Ledger | None = None) -> dict | None:
    ledger = ledger or Ledger(storage)
    job = ledger.job(job_id)
    if job is None:
        return None
    shards = ledger.shards(job_id) if job.status != JobState.REJECTED else []
    states = Counter(s.status for s in shards)
    nodes = sorted({s.node for s in shards if s.status == ShardState.RUNNING and s.node})
    out = {"job_id": job_id, **_fields(job),
           "shards": {**{state.value: states[state] for state in ShardState}, "total": len(shards)},
           "workers": nodes, "preemptions": sum(s.preemptions for s in shards)}
    out["failures"] = [{"shard": s.shard_id, "error": s.error} for s in shards
                       if s.status == ShardState.FAILED][:20]
    out.update(after_view(ledger, job))  # its chain, analysis and notifications (upwell.after)
    return out


def list_jobs(storage: Storage, ledger: Ledger | None = None, limit: int = 200) -> list[dict]:
    ledger = ledger or Ledger(storage)
    rows = sorted(ledger.jobs(), key=lambda j: j.created_at, reverse=True)[:limit]
    return [{"job_id": j.job_id, **_fields(j)} for j in rows]
