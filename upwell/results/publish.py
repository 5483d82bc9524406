"""Build and publish a job's report exactly once: reports/<job>/index.html, summary.json, figures.

The report queue may deliver twice and the reconciler may re-enqueue; the job row's
report claim (an ETag-conditional update) lets one builder through, and the
``reported`` flag makes later deliveries no-ops.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from azure.core.exceptions import ResourceNotFoundError

from upwell import logs, names
from upwell.ledger import TERMINAL_JOB, Ledger
from upwell.storage import Storage
from upwell.timeutil import now_iso, parse_iso

log = logs.get("upwell.results.report")
CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".json": "application/json", ".png": "image/png"}


@dataclass(frozen=True)
class Published:
    job_id: str
    built: bool
    files: tuple[str, ...] = ()


def gather(storage: Storage, ledger: Ledger, job_id: str) -> tuple[dict, list[dict], list[dict], list[dict]]:
    job = ledger.job(job_id) or {"PartitionKey": job_id}
    shards = sorted(ledger.shards(job_id), key=lambda r: r["RowKey"])
    results = []
    for blob in storage.list(names.RESULTS, f"{job_id}/"):
        if blob.name.count("/") == 1 and blob.name.endswith(".json"):
            try:
                results.append(json.loads(storage.read(f"{names.RESULTS}/{blob.name}")))
            except (ResourceNotFoundError, json.JSONDecodeError):
                continue
    events = scale_events(storage, job)
    return job, shards, results, events


def scale_events(storage: Storage, job: dict) -> list[dict]:
    """Scale decisions for the job's pool during the job's lifetime."""
    pool = job.get("pool")
    if not pool:
        return []
    start = job.get("created_at") or ""
    end = job.get("finished_at") or now_iso()
    table = storage.table(names.SCALE_TABLE)
    rows = table.query_entities("PartitionKey eq @p and RowKey ge @a and RowKey le @b",
                                parameters={"p": pool, "a": start, "b": end + "~"})
    return [{**dict(r), "pool": pool, "ts": r["RowKey"]} for r in rows if r["RowKey"] != "state"]


def publish(storage: Storage, job_id: str, ledger: Ledger | None = None, *, force: bool = False) -> Published:
    """Build the report if this caller wins the claim; idempotent."""
    from upwell.results.report import build_report

    ledger = ledger or Ledger(storage)
    job = ledger.job(job_id)
    if job is None or job.get("status") not in TERMINAL_JOB:
        return Published(job_id, False)
    if not force and not ledger.claim_report(job_id):
        return Published(job_id, False)
    job, shards, results, events = gather(storage, ledger, job_id)
    files = build_report(job, shards, results, events, fetch=storage.read)
    written = []
    for rel, data in files.items():
        ext = "." + rel.rsplit(".", 1)[-1]
        path = f"{names.REPORTS}/{job_id}/{rel}"
        storage.write(path, data, content_type=CONTENT_TYPES.get(ext))
        written.append(path)
    ledger.update_job(job_id, reported=True, reported_at=now_iso(), report_blob=f"{names.REPORTS}/{job_id}/index.html",
                      report_count=int(job.get("report_count") or 0) + 1)
    log.info("report.published", job_id=job_id, files=len(written))
    return Published(job_id, True, tuple(written))


def reconcile(storage: Storage, ledger: Ledger | None = None, *, stale_s: float = 60.0,
              jobs: Iterable[dict] | None = None) -> list[str]:
    """Re-enqueue reports for terminal jobs that were never reported (a lost message or a crash).
    ``jobs``: the job rows to look at (default: every terminal job)."""
    import time

    from upwell.results.collect import report_queue

    ledger = ledger or Ledger(storage)
    requeued = []
    rows = ledger.jobs(*[s for s in TERMINAL_JOB if s != "rejected"]) if jobs is None else jobs
    for job in rows:
        if job.get("status") not in TERMINAL_JOB or job.get("status") == "rejected":
            continue
        if job.get("reported"):
            continue
        claimed = float(job.get("report_claimed") or 0)
        if claimed and time.time() - claimed < stale_s:
            continue
        finished = parse_iso(job.get("finished_at"))
        if finished is not None and (datetime.now(UTC) - finished).total_seconds() < stale_s:
            continue  # the collect function's own message is probably still on its way
        report_queue(storage).send_message(json.dumps({"job_id": job["PartitionKey"]}))
        requeued.append(job["PartitionKey"])
    return requeued
