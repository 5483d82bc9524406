"""The live dashboard's data: one JSON snapshot of jobs, pools, the nodes (heartbeats with their age), the
quarantine, scaling decisions and janitor findings, and one job's detail. The page (``static/``) polls these;
every asset ships in the package (no CDN). Pure reads of storage: no state is kept between requests.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any

from upwell import names
from upwell.access.principal import Caller
from upwell.ledger import JobRow, JobState, Ledger, ShardRow, ShardState
from upwell.ops.jobapi import JobAPI
from upwell.results import points
from upwell.results.status import counts, holders, shard_page
from upwell.scalelog import DecisionRow, ScalingLog
from upwell.storage import Storage
from upwell.timeutil import now_iso, parse_iso

ASSETS = {"dashboard.js": "text/javascript; charset=utf-8", "dashboard.css": "text/css; charset=utf-8",
          "index.html": "text/html; charset=utf-8"}
JOB_LIMIT = 40  # jobs listed
SCOPED_READ = 5  # a caller limited to some projects: their JOB_LIMIT newest among this many pages of the index
DETAIL_LIMIT = 12  # most recent jobs whose shards are read for recoveries
DETAIL_SHARDS = 1000  # jobs of more shards are listed from their counters alone
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
            "notify_failed": str((job.extra or {}).get("notify_failed") or "") or None,  # upwell.after.notify
            "points": points.progress(job)}  # a job of blocks: points done of points total
    if shards is not None:
        line["running"] = sum(1 for s in shards if s.status == ShardState.RUNNING)
        line["recoveries"] = sum(s.preemptions + s.failures for s in shards)
        line["preemptions"] = sum(s.preemptions for s in shards)
    return line


def jobs(ledger: Ledger, now: datetime, visible: Callable[[JobRow], bool] | None = None) -> list[dict]:
    """The open jobs and the latest ended (JOB_LIMIT in all), with the shards of the open ones and of the
    DETAIL_LIMIT newest: what it reads grows with the open work, not with every job ever run. ``visible``:
    only the jobs a caller may see (of a wider page of the index, so that other projects' jobs do not
    crowd theirs out)."""
    if visible is None:
        rows = ledger.recent_jobs(JOB_LIMIT)  # the open jobs and the latest ended, through the index: no table scan
    else:
        rows = [j for j in ledger.recent_jobs(JOB_LIMIT * SCOPED_READ) if visible(j)][:JOB_LIMIT]
    out = []
    for i, job in enumerate(rows):
        active = job.status not in TERMINAL
        detail = (active or i < DETAIL_LIMIT) and job.status != JobState.REJECTED \
            and job.shards_total <= DETAIL_SHARDS  # a bigger job shows its counters only (upwell.results.status)
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


def nodes(storage: Storage, settings: Any, now: datetime, jobs_seen: set[str] | None = None) -> list[dict]:
    """Each pool's nodes as their agents last beat (one partition read per pool): state, the age of the
    beat, the shards in hand, the drain mark, whether the beat is old enough to call the agent dead, and the
    Scheduled Events a node in ``maintenance`` waits out (``event``).
    ``jobs_seen``: a scoped caller's jobs; shards of other jobs are left out of what a node holds."""
    from upwell.nodelog import Liveness, NodeLog

    log, liveness, at = NodeLog(storage), Liveness.from_env(os.environ), now.timestamp()
    return [{"pool": r.pool, "node": r.node, "state": r.state.value, "age_s": round(r.age(at), 1),
             "beat_at": r.beat_at, "shards": _shards_seen(r.shards, jobs_seen), "draining": r.draining,
             "dead": r.dead(at, liveness), "vm_size": r.vm_size, "spot": r.spot, "event": r.event}
            for name in settings.pools for r in log.nodes(name)]


def _shards_seen(shards, jobs_seen: set[str] | None) -> list[str]:
    """A node's shards in hand ("<job>/<shard>"), only those of ``jobs_seen`` where given."""
    return [s for s in shards if jobs_seen is None or str(s).split("/", 1)[0] in jobs_seen]


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


def snapshot(storage: Storage, settings: Any, caller: Caller | None = None) -> dict[str, Any]:
    """The page's data. A caller limited to some projects (``upwell.access.principal``) sees only their jobs,
    the quarantine of those jobs, only their shards on the nodes, and no janitor findings (the deployment's
    cloud resources are the operators')."""
    from upwell.ops.findings import FindingsLog

    now = datetime.now(UTC)
    scoped = caller is not None and not caller.everything
    visible = (lambda job: caller.allows(job.project or settings.project)) if scoped else None
    pool_rows, decisions = pools(storage, settings, now)
    ledger = Ledger(storage)
    job_rows = jobs(ledger, now, visible)
    seen = {j["job_id"] for j in job_rows} if scoped else None
    findings = [] if scoped else FindingsLog(storage).recent(20)
    return {"generated_at": now_iso(), "caller": _caller(caller), "jobs": job_rows, "pools": pool_rows,
            "decisions": decisions, "nodes": nodes(storage, settings, now, seen),
            "quarantine": _quarantine_seen(storage, ledger, visible),
            "janitor": [{"RowKey": r.row_key, "kind": r.finding.kind, "name": r.finding.name,
                         "reason": r.finding.reason, "action": r.finding.action, "result": r.finding.result,
                         "tagged": r.finding.tagged, "applied": r.applied} for r in findings]}


def _caller(caller: Caller | None) -> dict[str, Any]:
    if caller is None or caller.everything:
        return {"kind": caller.kind if caller else "function_key", "name": caller.name if caller else "",
                "projects": None}
    return {"kind": caller.kind, "name": caller.name, "projects": sorted(caller.projects or ())}


def _quarantine_seen(storage: Storage, ledger: Ledger, visible: Callable[[JobRow], bool] | None) -> list[dict]:
    """The quarantine; for a scoped caller only the entries whose job they may see."""
    items = quarantine(storage)
    if visible is None:
        return items
    return [q for q in items if q["job_id"] and (job := ledger.job(q["job_id"])) is not None and visible(job)]


def job_detail(api: JobAPI, job_id: str, after: str = "") -> dict[str, Any] | None:
    """A job and one page of its shards after shard id ``after`` (``next``: the cursor of the page after, ""
    at the end): where each ran, its attempts, node time, cost, CPU seconds and peak RSS (as the agent measured
    the payload's last attempt: ``workers.procs.Usage``; None until one was measured), and where its log is.
    The counts come from the job's counters, never from reading every shard."""
    job = api.job(job_id, "see jobs")
    if job is None:
        return None
    storage = api.storage
    shards, following = shard_page(storage, job_id, after, ledger=api.ledger)
    line = job_line(job, shards if job.shards_total <= len(shards) and not after else None, datetime.now(UTC))
    line["counts"] = counts(job, sum(len(v) for v in holders(storage, job).values()))
    line["next"] = following
    line["estimate_basis"] = job.estimate_basis
    shards = [p for s in shards for p in points.expand_row(s)]  # a block's row as its points' rows
    line["shards"] = [{"shard_id": s.shard_id, "status": s.status.value, "node": s.node, "attempts": s.attempts,
                       "preemptions": s.preemptions, "failures": s.failures, "node_seconds": s.paid_seconds,
                       "cost_usd": s.cost_usd, "cpu_s": s.cpu_s or None, "max_rss_mb": s.max_rss_mb or None,
                       "log": f"jobs/{job_id}/shards/{points.block_of(s.shard_id)}/log" if s.attempts or s.terminal
                       else None, "silent": s.terminal and s.log_bytes == 0, "error": s.error[:300]}
                      for s in shards]
    return line


def report_file(api: JobAPI, job_id: str, path: str) -> tuple[bytes, str] | None:
    """A file of a job's report (reports/<job>/<path>) the caller may see; None when absent or the path
    leaves the folder; ProjectForbidden for a job of another project."""
    parts = path.split("/")
    if not path or any(p in ("", ".", "..") for p in parts) or "/" in job_id or job_id in ("", ".", ".."):
        return None
    if api.job(job_id, "read reports") is None:
        return None
    try:
        data = api.storage.read(f"{names.REPORTS}/{job_id}/{path}")
    except Exception:  # noqa: BLE001 - not there (yet)
        return None
    ext = "." + path.rsplit(".", 1)[-1].lower() if "." in path else ""
    return data, REPORT_TYPES.get(ext, "application/octet-stream")
