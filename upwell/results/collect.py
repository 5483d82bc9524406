"""Collect: a result landed; mark its shard terminal and, for the last one, ask for the report.

Exactly-once: the shard row and the job counters change in one ETag-conditional
transaction (upwell.ledger.finish_shard), so a redelivered result is a no-op and
exactly one invocation sees the job become terminal.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from upwell import cost, logs, names
from upwell.errors import ConfigError, NotFound
from upwell.jobviews import JobViews
from upwell.ledger import JobRow, Ledger, ShardRow, ShardState
from upwell.results import points
from upwell.storage import Storage

RESULT_NAME = re.compile(r"^(?P<job>[^/]+)/(?P<shard>[^/]+)\.json$")
# A Table String property holds up to 64 KiB as UTF-16 and an entity 1 MiB in all ("Understanding the Table
# service data model", learn.microsoft.com/rest/api/storageservices): ASCII JSON of at most this many characters
# is well inside the first and leaves the rest of the shard row (error, stderr tail, history) room in the second.
ROW_RESULT_CHARS = 30_000
log = logs.get("upwell.results.collect")


@dataclass(frozen=True)
class Collected:
    job_id: str
    shard_id: str
    counted: bool
    job_done: bool
    job_status: str


def shard_cost(doc: dict, job: JobRow) -> float:
    """node-seconds x price x the job's share of a node, for this shard's attempts (failed and preempted too)."""
    t = doc.get("timings") or {}
    node_seconds = float(t.get("node_seconds") or 0) + float(t.get("preempted_node_seconds") or 0) \
        + float(t.get("failed_node_seconds") or 0)
    try:
        spot = bool((doc.get("node") or {}).get("spot"))
        share = job.node_share or 1.0
        return float(cost.shard_usd(node_seconds, job.price_key or "local", spot, share) or 0.0)
    except ConfigError:  # unknown price key: no cost rather than a lost shard
        return 0.0


def request_report(storage: Storage, job_id: str) -> None:
    """Ask for the job's report. Plain JSON text: host.json sets the queue messageEncoding to "none"."""
    storage.send(names.REPORT_QUEUE, json.dumps({"job_id": job_id}))


def close_counted(storage: Storage, ledger: Ledger, job_id: str) -> str:
    """End a job whose every shard is counted but that no finisher ended (more finishes than the recheck
    window were in flight as its last one committed, upwell.jobcounts), and ask for its report: the job's
    terminal state for the one caller that ended it, "" for every other (the reconciler's pass calls it)."""
    status = ledger.close_job(job_id)
    if status:
        request_report(storage, job_id)
        log.info("collect.job_done", job_id=job_id, job_status=status, closed_by="reconcile")
    return status or ""


def _shard_seen(doc: dict, job_id: str, shard_id: str) -> ShardRow | None:
    """The shard row as the agent left it before writing the result (its status and ETag, workers.results),
    so finish_shard can try its transaction without reading the row; None when the result does not say."""
    seen = doc.get("shard_row")
    if not isinstance(seen, dict) or not isinstance(seen.get("etag"), str) or not seen["etag"]:
        return None
    try:
        status = ShardState(seen.get("status"))
    except ValueError:
        return None
    return ShardRow(job_id=job_id, shard_id=shard_id, status=status, etag=seen["etag"])


def row_result(doc: dict) -> str:
    """The result document as the shard row keeps it for the report (upwell.results.publish.gather): compact,
    ASCII-only JSON (one character, one UTF-16 unit), or "" when longer than ROW_RESULT_CHARS or not JSON-able;
    the blob results/<job>/<shard>.json stays the record."""
    try:
        text = json.dumps(doc, separators=(",", ":"))
    except (TypeError, ValueError):
        return ""
    return text if len(text) <= ROW_RESULT_CHARS else ""


def _usage(timings: dict) -> dict[str, float]:
    """The payload's CPU seconds and peak RSS as the agent measured them (workers.usage), where it did."""
    return {k: float(timings[k]) for k in ("cpu_s", "max_rss_mb") if isinstance(timings.get(k), int | float)}


def is_shard_result(name: str) -> bool:
    """results/<name> is a shard's result (<job>/<shard>.json), not an artifact the shard wrote beside it
    (<job>/<shard>/<file>). Pure: the trigger asks it before opening storage, so an artifact that still
    gets an event (a subscription without the suffix filter, a `.json` artifact) costs no storage call."""
    return RESULT_NAME.match(name) is not None


def collect(storage: Storage, name: str, ledger: Ledger | None = None,
            views: JobViews | None = None) -> Collected | None:
    """Handle results/<name>. Artifacts (results/<job>/<shard>/<file>) are ignored. ``views``: the job views
    this process keeps between finishes (upwell.jobviews), tried before a read of the job."""
    m = RESULT_NAME.match(name)
    if not m:
        return None
    ledger = ledger or Ledger(storage)
    job_id, shard_id = m["job"], m["shard"]
    try:
        doc = json.loads(storage.read(f"{names.RESULTS}/{name}"))
        kept = row_result(doc) if isinstance(doc, dict) else ""  # the report reads this copy instead of the blob
    except NotFound:
        return None
    except json.JSONDecodeError:
        doc, kept = {"status": "failed", "error": f"results/{name} is not valid JSON"}, ""
    job = (views and views.get(job_id)) or ledger.job(job_id) or JobRow(job_id=job_id)
    status = ShardState.SUCCEEDED if doc.get("status") == "succeeded" else ShardState.FAILED
    t = doc.get("timings") or {}
    fields = {"finished_at": t.get("finished") or "", "error": (doc.get("error") or "")[:2000],
              "stderr_tail": (doc.get("stderr_tail") or "")[-4000:], "node_seconds": float(t.get("node_seconds") or 0),
              "result_blob": f"{names.RESULTS}/{name}", "result_json": kept, **_usage(t)}
    if doc.get("poisoned"):
        fields["poisoned"] = True
    if (failed_points := points.failed_points(doc)) is not None:  # a block's (upwell.results.points)
        fields["points_failed"] = failed_points
    if isinstance(doc.get("log_bytes"), int):  # 0: the payload printed nothing and kept no log
        fields["log_bytes"] = doc["log_bytes"]
    if (doc.get("node") or {}).get("id"):
        fields["node"] = doc["node"]["id"]
    fields["cost_usd"] = shard_cost(doc, job)
    done = ledger.finish_shard(job_id, shard_id, status, fields, cost_usd=fields["cost_usd"], job=job,
                               shard=_shard_seen(doc, job_id, shard_id))
    if views is not None and done.counted:
        views.keep(job_id, done.view)
    bound = log.bind(job_id=job_id, shard_id=shard_id)
    bound.info("collect.shard", status=status.value, counted=done.counted, job_done=done.job_done)
    if done.job_done:
        request_report(storage, job_id)
        bound.info("collect.job_done", job_status=done.job_status)
    return Collected(job_id, shard_id, done.counted, done.job_done, done.job_status)
