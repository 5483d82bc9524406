"""The live dashboard's data: one JSON snapshot of jobs, pools, the nodes (heartbeats with their age), the
quarantine, scaling decisions and janitor findings, and one job's detail. The page (``static/``) polls these;
every asset ships in the package (no CDN). Pure reads of storage: no state is kept between requests.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any

from upwell import names
from upwell.ledger import JobRow, JobState, Ledger, ShardRow, ShardState
from upwell.scalelog import DecisionRow, ScalingLog
from upwell.storage import Storage
from upwell.timeutil import now_iso, parse_iso

ASSETS = {"dashboard.js": "text/javascript; charset=utf-8", "dashboard.css": "text/css; charset=utf-8",
          "index.html": "text/html; charset=utf-8"}
JOB_LIMIT = 40  # jobs listed
DETAIL_LIMIT = 12  # most recent jobs whose shards are read for recoveries
SERIES_MINUTES = 30  # pool history shown
TERMINAL = ("succeeded", "partially_failed", "failed", "rejected")
STATE_LABEL = {"accepted": "queued", "ingesting": "queued"}
REPORT_TYPES = {".html": "text/html; charset=utf-8", ".json": "application/json", ".png": "image/png",
                ".svg": "image/svg+xml", ".csv": "text/csv"}


def asset(name: str) -> tuple[bytes, str] | None:
    """A packaged asset by name (only the known ones)."""
    if name not in ASSETS:
        return None
    data = resources.files("upwell.ops").joinpath("static", name).read_bytes()
    return data, ASSETS[name]


def page() -> bytes:
    """The page with its stylesheet and script inlined: one request, and on Azure no asset URL
    needs the function key."""
    html = asset("index.html")[0].decode()
    html = html.replace("/*upwell:css*/", asset("dashboard.css")[0].decode())
    return html.replace("/*upwell:js*/", asset("dashboard.js")[0].decode().replace("</", "<\\/")).encode()


def job_line(job: JobRow, shards: list[ShardRow] | None, now: datetime) -> dict[str, Any]:
    """One job as the page lists it: state, progress, cost so far, ETA and recoveries."""
    total = job.shards_total
    done = job.shards_done + job.shards_failed
    status = job.status.value
    eta = None
    started = parse_iso(job.started_at or None)
    if status == "running" and started and 0 < done < total:
        elapsed = (now - started).total_seconds()
        eta = elapsed / done * (total - done)
    line = {"job_id": job.job_id, "name": job.name, "status": status,
            "state": STATE_LABEL.get(status, status), "payload": job.payload, "pool": job.pool,
            "owner": job.owner, "project": job.project,
            "shards_total": total, "shards_finished": done, "shards_failed": job.shards_failed,
            "progress": (done / total) if total else (1.0 if status in TERMINAL and status != "rejected" else 0.0),
            "spent_usd": job.spent_usd, "estimate_usd": job.estimate_usd or None,
            "budget_usd": job.budget_usd, "eta_s": eta,
            "created_at": job.created_at, "finished_at": job.finished_at,
            "message": job.message, "reported": job.reported,
            "report": f"reports/{job.job_id}/index.html" if job.reported else None,
            "notify_failed": str((job.extra or {}).get("notify_failed") or "") or None}  # upwell.after.notify
    if shards is not None:
        line["running"] = sum(1 for s in shards if s.status == ShardState.RUNNING)
        line["recoveries"] = sum(s.preemptions + s.failures for s in shards)
        line["preemptions"] = sum(s.preemptions for s in shards)
    return line


def jobs(ledger: Ledger, now: datetime) -> list[dict]:
    """The open jobs and the latest ended (JOB_LIMIT in all), with the shards of the open ones and of the
    DETAIL_LIMIT newest: what it reads grows with the open work, not with every job ever run."""
    rows = ledger.recent_jobs(JOB_LIMIT)  # the open jobs and the latest ended, through the index: no table scan
    out = []
    for i, job in enumerate(rows):
        active = job.status not in TERMINAL
        detail = (active or i < DETAIL_LIMIT) and job.status != JobState.REJECTED
        out.append(job_line(job, list(ledger.shards(job.job_id)) if detail else None, now))
    return out


def pools(storage: Storage, settings: Any, now: datetime) -> tuple[list[dict], list[dict]]:
    """Per pool: nodes against backlog over the last minutes, spot share, caps; and recent decisions."""
    log = ScalingLog(storage)
    since = (now - timedelta(minutes=SERIES_MINUTES)).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    out, decisions = [], []
    for name, spec in settings.pools.items():
        rows = log.decisions(name, since)
        series = [{"ts": r.at, "nodes": r.nodes, "target": r.target, "backlog": r.backlog, "spot": r.spot}
                  for r in rows]
        last = rows[-1] if rows else DecisionRow(name, "")
        out.append({"pool": name, "backend": spec.backend, "min_nodes": spec.min_nodes, "max_nodes": spec.max_nodes,
                    "spot_share": spec.spot_share, "price_key": spec.price_key,
                    "nodes": last.nodes, "target": last.target, "capped_by": last.capped_by, "reason": last.reason,
                    "message": last.message, "series": series[-120:]})
        decisions += [{"pool": name, "ts": r.at, "target": r.target, "nodes": r.nodes, "capped_by": r.capped_by,
                       "reason": r.reason} for r in rows[-10:]]
    decisions.sort(key=lambda d: d["ts"], reverse=True)
    return out, decisions[:25]


def nodes(storage: Storage, settings: Any, now: datetime) -> list[dict]:
    """Each pool's nodes as their agents last beat (one partition read per pool): state, the age of the
    beat, the shards in hand, the drain mark, and whether the beat is old enough to call the agent dead."""
    from upwell.nodelog import Liveness, NodeLog

    log, liveness, at = NodeLog(storage), Liveness.from_env(os.environ), now.timestamp()
    return [{"pool": r.pool, "node": r.node, "state": r.state.value, "age_s": round(r.age(at), 1),
             "beat_at": r.beat_at, "shards": list(r.shards), "draining": r.draining, "dead": r.dead(at, liveness),
             "vm_size": r.vm_size, "spot": r.spot} for name in settings.pools for r in log.nodes(name)]


def quarantine(storage: Storage, limit: int = 20) -> list[dict]:
    items = [b for b in storage.list(names.QUARANTINE) if b.name.endswith(".error.json")]
    items.sort(key=lambda b: b.last_modified or datetime.min.replace(tzinfo=UTC), reverse=True)
    out = []
    for b in items[:limit]:
        try:
            err = json.loads(storage.read(f"{names.QUARANTINE}/{b.name}"))
        except (ValueError, Exception):  # noqa: BLE001 - an unreadable error file still shows its name
            err = {}
        out.append({"blob": f"{names.QUARANTINE}/{b.name[:-len('.error.json')]}", "error": err.get("message")
                    or err.get("error") or "", "field": err.get("field") or "", "row": err.get("row"),
                    "job_id": err.get("job_id") or "", "at": err.get("rejected_at") or ""})
    return out


def snapshot(storage: Storage, settings: Any) -> dict[str, Any]:
    from upwell.ops.findings import FindingsLog

    now = datetime.now(UTC)
    pool_rows, decisions = pools(storage, settings, now)
    return {"generated_at": now_iso(), "jobs": jobs(Ledger(storage), now), "pools": pool_rows,
            "decisions": decisions, "nodes": nodes(storage, settings, now), "quarantine": quarantine(storage),
            "janitor": [{"RowKey": r.row_key, "kind": r.finding.kind, "name": r.finding.name,
                         "reason": r.finding.reason, "action": r.finding.action, "result": r.finding.result,
                         "tagged": r.finding.tagged, "applied": r.applied} for r in FindingsLog(storage).recent(20)]}


def job_detail(storage: Storage, job_id: str) -> dict[str, Any] | None:
    ledger = Ledger(storage)
    job = ledger.job(job_id)
    if job is None:
        return None
    shards = sorted(ledger.shards(job_id), key=lambda r: r.shard_id)
    line = job_line(job, shards, datetime.now(UTC))
    line["estimate_basis"] = job.estimate_basis
    line["shards"] = [{"shard_id": s.shard_id, "status": s.status.value, "node": s.node, "attempts": s.attempts,
                       "preemptions": s.preemptions, "failures": s.failures, "node_seconds": s.paid_seconds,
                       "cost_usd": s.cost_usd, "error": s.error[:300]}
                      for s in shards]
    return line


def report_file(storage: Storage, job_id: str, path: str) -> tuple[bytes, str] | None:
    """A file of a job's report (reports/<job>/<path>); None when absent or the path leaves the folder."""
    parts = path.split("/")
    if not path or any(p in ("", ".", "..") for p in parts) or "/" in job_id or job_id in ("", ".", ".."):
        return None
    try:
        data = storage.read(f"{names.REPORTS}/{job_id}/{path}")
    except Exception:  # noqa: BLE001 - not there (yet)
        return None
    ext = "." + path.rsplit(".", 1)[-1].lower() if "." in path else ""
    return data, REPORT_TYPES.get(ext, "application/octet-stream")
