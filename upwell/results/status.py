"""Where jobs stand: counts by shard state, workers, cost so far, and the pool's word."""

from __future__ import annotations

from collections import Counter

from upwell.ledger import Ledger
from upwell.storage import Storage

JOB_FIELDS = ("name", "status", "payload", "pool", "shards_total", "shards_done", "shards_failed", "spent_usd",
              "estimate_usd", "budget_usd", "created_at", "finished_at", "message", "reported", "report_blob",
              "source_blob", "quarantine_blob")


def job_status(storage: Storage, job_id: str, ledger: Ledger | None = None) -> dict | None:
    ledger = ledger or Ledger(storage)
    job = ledger.job(job_id)
    if job is None:
        return None
    shards = ledger.shards(job_id) if job.get("status") != "rejected" else []
    states = Counter(s.get("status", "queued") for s in shards)
    nodes = sorted({s["node"] for s in shards if s.get("status") == "running" and s.get("node")})
    out = {"job_id": job_id, **{k: job.get(k) for k in JOB_FIELDS},
           "shards": {"queued": states["queued"], "running": states["running"], "preempted": states["preempted"],
                      "succeeded": states["succeeded"], "failed": states["failed"],
                      "cancelled": states["cancelled"], "total": len(shards)},
           "workers": nodes, "preemptions": sum(int(s.get("preemptions") or 0) for s in shards)}
    out["failures"] = [{"shard": s["RowKey"], "error": s.get("error", "")} for s in shards
                       if s.get("status") == "failed"][:20]
    return out


def list_jobs(storage: Storage, ledger: Ledger | None = None, limit: int = 200) -> list[dict]:
    ledger = ledger or Ledger(storage)
    rows = sorted(ledger.jobs(), key=lambda j: j.get("created_at") or "", reverse=True)[:limit]
    return [{"job_id": j["PartitionKey"], **{k: j.get(k) for k in JOB_FIELDS}} for j in rows]
