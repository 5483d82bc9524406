"""The machine-readable summary of a job (``summary.json``), worked out from the shard views.

Pure: no plotting, no I/O. Every section copes with missing fields and zero shards.
The HTML report renders this same dict, so the two never disagree.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import numpy as np

from upwell import cost
from upwell.results.report.model import ShardView, as_dict, is_number, is_scalar, iso, parse_ts
from upwell.rows import JobRow

SCHEMA = 1
STATUS_LABELS = {"succeeded": "succeeded", "partially_failed": "partially failed", "failed": "failed",
                 "running": "running", "accepted": "accepted", "rejected": "rejected"}
STDERR_CHARS = 4000
STDERR_LINES = 60
ERROR_CHARS = 2000
MAX_EVENTS = 60  # scale events listed in the report (all of them are plotted)
PROVENANCE_FIELDS = ("code_version", "image_digest", "input_sha256", "manifest_hash", "python")
TOTAL_KEYS = ("total_steps", "steps", "epochs", "iterations", "n_steps")


def summarize(job: JobRow, views: list[ShardView], results: list[dict], scale_events: list[dict],
              prices: cost.PriceTable) -> dict[str, Any]:
    counts = count(job, views, results)
    return {
        "schema": SCHEMA,
        "generated_at": iso(datetime.now(UTC)),
        "job": job_info(job, views, results),
        "counts": counts,
        "timings": timings(job, views),
        "cost": cost_summary(job, views, prices),
        "failures": failures(views),
        "checkpoints": checkpoints(views),
        "scaling": scaling(scale_events, views),
        "provenance": provenance(job, views),
        "shards": [shard_row(v, shard_cost(v, job, prices)) for v in views],
    }


def job_info(job: JobRow, views: list[ShardView], results: list[dict]) -> dict:
    job_id = job.job_id or next(
        (r.get("job_id") for r in results if isinstance(r, dict) and r.get("job_id")), None) or "unknown"
    status = job.status.value
    payload = job.payload or next((v.payload for v in views if v.payload), "")
    return {
        "id": str(job_id), "name": job.name, "description": job.description,
        "status": status, "status_label": STATUS_LABELS.get(status, status.replace("_", " ")),
        "payload": str(payload), "pool": job.pool, "message": job.message,
        "created_at": iso(parse_ts(job.created_at)), "finished_at": iso(parse_ts(job.finished_at)),
        "source_blob": job.source_blob, "spot": job.spot, "price_key": job.price_key,
    }


def count(job: JobRow, views: list[ShardView], results: list[dict]) -> dict:
    by = Counter("failed" if v.failed else v.status for v in views)
    known = {"succeeded", "failed", "preempted", "running", "queued"}
    return {
        "shards_total": max(job.shards_total, len(views)),
        "succeeded": by["succeeded"], "failed": by["failed"], "preempted": by["preempted"],
        "running": by["running"], "queued": by["queued"],
        "other": sum(n for s, n in by.items() if s not in known),
        "poisoned": sum(1 for v in views if v.poisoned),
        "results": sum(1 for r in results if isinstance(r, dict)),
    }


def stats(values: list[float | None]) -> dict:
    xs = np.array([x for x in values if x is not None and math.isfinite(x)], dtype=float)
    if not xs.size:
        return {"n": 0, "mean": None, "p50": None, "p95": None, "max": None, "total": 0.0}
    p50, p95 = np.percentile(xs, [50, 95])
    return {"n": int(xs.size), "mean": float(xs.mean()), "p50": float(p50), "p95": float(p95),
            "max": float(xs.max()), "total": float(xs.sum())}


def timings(job: JobRow, views: list[ShardView]) -> dict:
    queued = [v.queued for v in views if v.queued] or [t for t in (parse_ts(job.created_at),) if t]
    finished = [v.finished for v in views if v.finished] or [t for t in (parse_ts(job.finished_at),) if t]
    first, last = (min(queued) if queued else None), (max(finished) if finished else None)
    makespan = (last - first).total_seconds() if first and last and last >= first else None
    return {
        "first_queued": iso(first), "last_finished": iso(last), "makespan_s": makespan,
        "queue_wait_s": stats([v.queue_wait_s for v in views]),
        "run_s": stats([v.run_s for v in views]),
        "node_seconds": float(sum(v.node_seconds or 0.0 for v in views)),
    }


def _share(job: JobRow) -> float:
    return job.node_share or 1.0


def _cost_rows(views: list[ShardView], share: float = 1.0) -> list[dict]:
    # Priced as collect prices them for the ledger's spent_usd (the job's key, the node's
    # spot flag, the job's share of a node), so the report and the budget agree; local nodes
    # are flagged as notional.
    return [{"node_seconds": v.node_seconds, "spot": v.spot, "pool": v.pool, "price_key": v.price_key,
             "share": share} for v in views]


def shard_cost(v: ShardView, job: JobRow, table: cost.PriceTable) -> float | None:
    """The shard's own figure (what `upwell cost` sums): paid node-seconds x price x node share."""
    key = v.price_key or job.price_key or cost.DEFAULT_KEY
    return cost.shard_usd(v.node_seconds, key, v.spot, _share(job), prices=table) if v.node_seconds else 0.0


def cost_summary(job: JobRow, views: list[ShardView], table: cost.PriceTable) -> dict:
    """Estimate against actual. A zero estimate on the row is one that was never made."""
    key = job.price_key or cost.DEFAULT_KEY
    spot = job.spot
    lines = cost.breakdown(_cost_rows(views, _share(job)), key, prices=table, strict=False)
    seconds = sum(ln.node_seconds for ln in lines)
    actual = sum(ln.usd or 0.0 for ln in lines)
    est_s = job.estimate_node_seconds or None
    est_usd, est_from = job.estimate_usd or None, "job"
    if est_usd is None and est_s is not None and key in table:
        est_usd, est_from = cost.estimate(est_s, key, spot, prices=table), "price table"
    budget = job.budget_usd
    azure = table.azure_equivalent(key)
    return {
        "currency": table.currency, "prices_as_of": table.as_of, "prices_source": table.source,
        "price_key": key, "spot": spot,
        "estimate_usd": est_usd, "estimate_from": est_from if est_usd is not None else None,
        "estimate_node_seconds": est_s,
        "actual_usd": actual, "actual_node_seconds": seconds,
        "node_seconds_from_run_time": sum(1 for v in views if v.node_seconds_from == "run time"),
        "earlier_attempts_node_seconds": sum(v.preempted_node_seconds + v.failed_node_seconds for v in views),
        "local_shards": sum(1 for v in views if v.vm_size == "local" and v.node_seconds),
        "cpu_wait_s": sum(v.cpu_wait_s for v in views),
        "ledger_spent_usd": job.spent_usd,
        "node_share": _share(job), "estimate_basis": job.estimate_basis,
        "estimate_spot_fraction": job.estimate_spot_fraction,
        "estimate_error_pct": (100.0 * (actual - est_usd) / est_usd) if est_usd else None,
        "lines": [{"key": ln.key, "spot": ln.spot, "shards": ln.shards, "node_seconds": ln.node_seconds,
                   "usd_per_hour": ln.per_hour, "usd": ln.usd} for ln in lines],
        "unpriced_keys": sorted({ln.key for ln in lines if ln.usd is None}),
        "budget_usd": budget, "budget_left_usd": None if budget is None else budget - actual,
        "over_budget": budget is not None and actual > budget,
        "azure": None if azure is None else {
            "key": azure.key, "sku": azure.alias_of or azure.key, "region": azure.region,
            "payg_per_hour": azure.payg, "spot_per_hour": azure.per_hour(True),
            "payg_usd": seconds / 3600.0 * azure.payg, "spot_usd": seconds / 3600.0 * azure.per_hour(True),
            "note": azure.note},
    }


def tail(text: str, max_chars: int = STDERR_CHARS, max_lines: int = STDERR_LINES) -> tuple[str, int]:
    """The end of a text, at most max_lines lines and max_chars characters; and how much was cut."""
    cut = text[-max_chars:] if len(text) > max_chars else text
    lines = cut.splitlines()
    if len(lines) > max_lines:
        cut = "\n".join(lines[-max_lines:])
    return cut, len(text) - len(cut)


def failures(views: list[ShardView]) -> list[dict]:
    out = []
    for v in views:
        if not v.failed:
            continue
        stderr, cut = tail(v.stderr_tail)
        error = v.error if len(v.error) <= ERROR_CHARS else v.error[:ERROR_CHARS] + " …"
        out.append({"shard_id": v.shard_id, "status": v.status, "poisoned": v.poisoned, "attempts": v.attempts,
                    "node": v.node, "pool": v.pool, "finished_at": iso(v.finished), "error": error,
                    "stderr_tail": stderr, "stderr_truncated_chars": cut, "params": _cells(v.params)})
    return out


def saved_seconds(v: ShardView) -> tuple[float | None, str]:
    """Compute a checkpoint saved this shard: as reported, else estimated from the resume point."""
    ck = as_dict(v.metrics.get("checkpoint"))
    for src in (v.timings, ck, v.metrics):
        for k in ("compute_saved_s", "saved_s", "checkpoint_saved_s"):
            if is_number(src.get(k)):
                return float(src[k]), "reported"
    resumed = v.resumed_from
    total = next((src[k] for src in (ck, v.metrics, v.params) for k in TOTAL_KEYS if is_number(src.get(k))), None)
    if is_number(resumed) and total and 0 < resumed < total and v.run_s:
        # The resumed attempt ran (total - resumed) units in run_s; the first `resumed` were not redone.
        return v.run_s * resumed / (total - resumed), "estimated"
    return None, ""


def _resumed(v: ShardView) -> bool:
    return v.resumed_from not in (None, "", 0, False)


def checkpoints(views: list[ShardView]) -> dict:
    """Preemptions, checkpoints and resumes; one row per shard that was preempted or resumed."""
    rows = []
    for v in views:
        if not (v.preemptions or _resumed(v) or v.history or v.fresh_start):
            continue
        saved, how = saved_seconds(v)
        resumed = v.resumed_from if is_scalar(v.resumed_from) or v.resumed_from is None else str(v.resumed_from)
        rows.append({"shard_id": v.shard_id, "status": v.status, "node": v.node, "preemptions": v.preemptions,
                     "checkpoints": v.checkpoints, "resumed_from": resumed, "saved_s": saved, "saved_how": how,
                     "fresh_start": v.fresh_start})
    saved = [r["saved_s"] for r in rows if r["saved_s"] is not None]
    return {"preemptions": sum(v.preemptions for v in views), "checkpoints": sum(v.checkpoints for v in views),
            "resumed_shards": sum(1 for v in views if _resumed(v)),
            "fresh_starts": sum(1 for v in views if v.fresh_start),
            "compute_saved_s": float(sum(saved)) if saved else None,
            "saved_estimated": any(r["saved_how"] == "estimated" for r in rows), "shards": rows}


def scale_points(events: list[dict], views: list[ShardView] = ()) -> list[dict]:
    """Scale events with parsed times, in time order; events without a readable time are dropped.

    With the job's shards (``views``), each point also carries this job's backlog (its shards queued or
    running) and the workers running its shards, and a point is added wherever one of its shards starts
    or ends (``decision`` False), so the nodes line follows the workers between the timer's records. A
    pool has at least as many nodes as run this job's shards: a record taken just before the pool grew
    (nodes 0 at the first decision) is corrected by that."""
    out = []
    for e in events or ():
        ts = parse_ts(e.get("ts")) if isinstance(e, dict) else None
        if ts is None:
            continue
        visible, in_flight = cost.to_float(e.get("visible")) or 0.0, cost.to_float(e.get("in_flight")) or 0.0
        out.append({"pool": str(e.get("pool") or "?"), "ts": ts, "target": cost.to_float(e.get("target")),
                    "nodes": cost.to_float(e.get("nodes")), "visible": visible, "in_flight": in_flight,
                    "backlog": visible + in_flight, "reason": str(e.get("reason") or ""),
                    "capped_by": str(e.get("capped_by") or ""), "message": str(e.get("message") or ""),
                    "decision": True})
    out.sort(key=lambda p: p["ts"])
    views = list(views or ())
    if views:
        out = _with_shard_changes(out, views)
        for p in out:
            p["job_backlog"], workers = _job_load(views, p["ts"])
            p["job_workers"] = float(workers)
            p["nodes"] = max(p["nodes"] or 0.0, float(workers))
    return out


def _job_load(views: list[ShardView], ts: datetime) -> tuple[float, int]:
    """(this job's shards queued or running at ts, distinct nodes running them at ts)."""
    def before_end(v: ShardView) -> bool:
        return v.finished is None or ts < v.finished

    backlog = sum(1 for v in views if v.queued is not None and v.queued <= ts and before_end(v))
    nodes = {v.node for v in views if v.node and v.started is not None and v.started <= ts and before_end(v)}
    return float(backlog), len(nodes)


def _with_shard_changes(points: list[dict], views: list[ShardView]) -> list[dict]:
    """Add a point (carrying the pool's last recorded state) wherever a shard of the job starts or ends."""
    pools = {p["pool"] for p in points} or {v.pool for v in views if v.pool}
    times = sorted({t for v in views for t in (v.started, v.finished) if t is not None})
    extra = []
    for pool in pools:
        mine = [p for p in points if p["pool"] == pool]
        stamps = [p["ts"] for p in mine]
        for ts in times:
            i = bisect.bisect_right(stamps, ts)
            base = dict(mine[i - 1]) if i else {"pool": pool, "target": None, "nodes": None, "visible": 0.0,
                                                "in_flight": 0.0, "backlog": 0.0}
            extra.append({**base, "ts": ts, "reason": "", "capped_by": "", "message": "", "decision": False})
    return sorted(points + extra, key=lambda p: p["ts"])


def scaling(events: list[dict], views: list[ShardView] = ()) -> dict:
    points = scale_points(events, views)
    pools: dict[str, dict] = {}
    notable, last_target = [], {}
    for p in points:
        s = pools.setdefault(p["pool"], {"events": 0, "max_target": 0.0, "max_nodes": 0.0, "max_backlog": 0.0,
                                         "max_pool_backlog": 0.0, "capped": 0})
        s["max_nodes"] = max(s["max_nodes"], p["nodes"] or 0.0)
        # "max backlog" is this job's (its shards queued or running); the pool's, other jobs included, apart.
        s["max_backlog"] = max(s["max_backlog"], p.get("job_backlog", p["backlog"]))
        s["max_pool_backlog"] = max(s["max_pool_backlog"], p["backlog"])
        if not p["decision"]:
            continue
        s["events"] += 1
        s["max_target"] = max(s["max_target"], p["target"] or 0.0)
        s["capped"] += bool(p["capped_by"])
        if p["target"] != last_target.get(p["pool"]) or p["capped_by"] or p["message"]:
            notable.append({k: v for k, v in p.items() if k != "decision"} | {"ts": iso(p["ts"])})
        last_target[p["pool"]] = p["target"]
    return {"events": sum(1 for p in points if p["decision"]), "pools": pools, "notable": notable[:MAX_EVENTS],
            "notable_omitted": max(len(notable) - MAX_EVENTS, 0)}


def provenance(job: JobRow, views: list[ShardView]) -> dict:
    values: dict[str, set[str]] = {f: set() for f in PROVENANCE_FIELDS}
    packages: dict[str, set[str]] = {}
    for f, value in (("code_version", job.code_version), ("manifest_hash", job.manifest_hash)):
        if value:
            values[f].add(value)
    for v in views:
        prov = v.provenance
        for f in PROVENANCE_FIELDS:
            if prov.get(f) not in (None, ""):
                values[f].add(str(prov[f]))
        for name, version in as_dict(prov.get("packages")).items():
            packages.setdefault(str(name), set()).add(str(version))
    return {"values": {f: sorted(s) for f, s in values.items()},
            "packages": {n: sorted(s) for n, s in sorted(packages.items())},
            "params": params_overview(views),
            "source": {"blob": job.source_blob, "etag": job.source_etag}}


def params_overview(views: list[ShardView]) -> dict:
    """Params that every shard shares (``common``) and those that vary across shards."""
    with_params = [_cells(v.params) for v in views if v.params]
    keys = sorted({k for p in with_params for k in p})
    common, varying = {}, []
    for k in keys:
        seen = {repr(p.get(k)) for p in with_params}
        if len(seen) == 1:
            common[k] = with_params[0].get(k)
        else:
            varying.append(k)
    return {"common": common, "varying": varying}


def _cells(d: dict) -> dict:
    """Scalars as they are; anything else as short text, so it fits a table cell and JSON."""
    out = {}
    for k, v in d.items():
        if isinstance(v, float) and not math.isfinite(v):
            out[str(k)] = None
        elif is_scalar(v) or v is None:
            out[str(k)] = v
        else:
            text = str(v)
            out[str(k)] = text if len(text) <= 120 else text[:117] + "…"
    return out


def shard_row(v: ShardView, cost_usd: float | None = None) -> dict:
    return {"cost_usd": cost_usd,
            "shard_id": v.shard_id, "status": v.status, "node": v.node, "pool": v.pool, "spot": v.spot,
            "attempts": v.attempts, "preemptions": v.preemptions, "queued_at": iso(v.queued),
            "started_at": iso(v.started), "finished_at": iso(v.finished), "queue_wait_s": v.queue_wait_s,
            "run_s": v.run_s, "node_seconds": v.node_seconds, "params": _cells(v.params),
            "metrics": _cells(v.scalar_metrics()), "has_result": v.has_result}
