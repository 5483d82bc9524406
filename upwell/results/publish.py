"""Build and publish a job's report exactly once: reports/<job>/index.html, summary.json, figures.

The report queue may deliver twice and the reconciler may re-enqueue; the job row's
report claim (an ETag-conditional update) lets one builder through, and the
``reported`` flag makes later deliveries no-ops.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime

from upwell import logs, names
from upwell.errors import NotFound
from upwell.ledger import TERMINAL_JOB, JobRow, JobState, Ledger, ShardRow
from upwell.results import points
from upwell.scalelog import ScalingLog
from upwell.settings import Settings
from upwell.storage import Storage
from upwell.timeutil import now_iso, parse_iso

log = logs.get("upwell.results.publish")
REPORT_WINDOW_S = 900.0  # the scale timer re-asks for reports of the jobs that ended this recently
READERS = 16  # result documents read at once while a report is gathered
CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".json": "application/json", ".png": "image/png",
                 ".csv": "text/csv; charset=utf-8"}


@dataclass(frozen=True)
class Published:
    job_id: str
    built: bool
    files: tuple[str, ...] = ()


def gather(storage: Storage, ledger: Ledger, job_id: str) -> tuple[JobRow, list[ShardRow], list[dict], list[dict]]:
    """What the report is built from: the job's rows, its result documents and the pool's scale events.
    A shard's result comes from its row where collect kept a copy (``ShardRow.result_json``, the same document
    as compact JSON, upwell.results.collect.row_result): no request beyond the rows already read. Only a row
    without one has its result read by name (``<job>/<shard>.json``; a shard that wrote none reads as missing),
    not found by listing ``results/<job>/``: a listing's pages cost more than the reads they save, and grew
    faster than the shards (issue 24; bench/README.md, "Report build"). A job without shard rows (pruned) has
    its results listed."""
    job = ledger.job(job_id) or JobRow(job_id=job_id)
    shards = sorted(ledger.shards(job_id), key=lambda r: r.shard_id)
    kept = [_kept(r) for r in shards]
    wanted: Iterable[str] = [f"{job_id}/{r.shard_id}.json" for r, doc in zip(shards, kept, strict=True)
                             if doc is None]
    if not shards:
        wanted = (b.name for b in storage.list(names.RESULTS, f"{job_id}/")
                  if b.name.count("/") == 1 and b.name.endswith(".json"))
    # one round trip per result: READERS at once, in listing order (100,000 one by one took minutes)
    with ThreadPoolExecutor(max_workers=READERS, thread_name_prefix="report-read") as pool:
        read = iter(pool.map(lambda name: _result(storage, name), wanted))
        docs = [doc if doc is not None else next(read) for doc in kept] if shards else list(read)
    results = [doc for doc in docs if doc is not None]
    events = scale_events(storage, job)
    shards, results = points.expand(shards, results)  # a block's result as its points (upwell.results.points)
    return job, shards, results, events


def _kept(row: ShardRow) -> dict | None:
    """The result document collect kept on the shard row; None when it kept none (too long) or it is unreadable."""
    if not row.result_json:
        return None
    try:
        doc = json.loads(row.result_json)
    except json.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None


def _result(storage: Storage, name: str) -> dict | None:
    """results/<name> as a document; None when it is gone or unreadable."""
    try:
        return json.loads(storage.read(f"{names.RESULTS}/{name}"))
    except (NotFound, json.JSONDecodeError):
        return None


def scale_events(storage: Storage, job: JobRow) -> list[dict]:
    """Scale decisions for the job's pool during the job's lifetime."""
    pool = job.pool
    if not pool:
        return []
    start = job.created_at
    end = job.finished_at or now_iso()
    rows = ScalingLog(storage).decisions(pool, start, end + "~")
    return [{**r.to_entity(), "pool": pool, "ts": r.at} for r in rows]


def publish(storage: Storage, job_id: str, ledger: Ledger | None = None, *, force: bool = False,
            settings: Settings | None = None) -> Published:
    """Build the report if this caller wins the claim; idempotent. The winner then runs the job-done
    transition's consequences (upwell.after.hook: reduce, notifications, chains), and builds again the
    report of a parent whose analysis this job was."""
    from upwell.after import hook
    from upwell.after.reduce import view as analysis_view
    from upwell.results.report import build_report

    ledger = ledger or Ledger(storage)
    job = ledger.job(job_id)
    if job is None or not job.terminal:
        return Published(job_id, False)
    if not force and not ledger.claim_report(job_id):
        return Published(job_id, False)
    again = hook.job_done(storage, ledger, job, settings) if not force else []
    job, shards, results, events = gather(storage, ledger, job_id)
    files = build_report(job, shards, results, events, fetch=storage.read, analysis=analysis_view(storage, job))
    written = []
    for rel, data in files.items():
        ext = "." + rel.rsplit(".", 1)[-1]
        path = f"{names.REPORTS}/{job_id}/{rel}"
        storage.for_project(job.project).write(path, data, content_type=CONTENT_TYPES.get(ext))
        written.append(path)
    ledger.change_job(job_id, lambda row: {"reported": True, "reported_at": now_iso(),
                                           "report_blob": f"{names.REPORTS}/{job_id}/index.html",
                                           "report_count": row.report_count + 1})  # one count per build
    log.info("report.published", job_id=job_id, files=len(written))
    for other in again:  # a reduce's parent: its report now shows the analysis
        publish(storage, other, ledger, force=True)
    # A fast reduce can end (and its report rebuild this one) while this build still rendered the analysis as
    # running; whichever build wrote last, the report must show the analysis as the row now has it.
    latest = ledger.job(job_id)
    if latest is not None and _analysis_of(latest) != _analysis_of(job):
        return publish(storage, job_id, ledger, force=True)
    return Published(job_id, True, tuple(written))


def _analysis_of(job: JobRow) -> tuple[str, ...]:
    """What a report shows of the job's analysis (upwell.after): its state, reduce job and error."""
    extra = job.extra or {}
    return tuple(str(extra.get(k) or "") for k in ("analysis_state", "analysis_job", "analysis_error"))


def reconcile(storage: Storage, ledger: Ledger | None = None, *, stale_s: float = 60.0,
              jobs: Iterable[JobRow] | None = None, reported: set[str] | None = None) -> list[str]:
    """Re-enqueue reports for terminal jobs that were never reported (a lost message or a crash).
    ``jobs``: the job rows to look at (default: those that ended in the last ``REPORT_WINDOW_S``, through the
    ledger's index: the scale timer calls this every run, and a read of every terminal job would grow with
    every job ever run; the reconciler's pass, upwell.ops.reconcile, looks further back). ``reported``: the
    caller's memo of the index entries (their RowKeys) whose jobs were found reported: their rows are not
    read again (a reported job stays reported; a rerun ends under a new entry); entries that left the
    window are dropped from it."""
    import time

    from upwell.results.collect import request_report

    ledger = ledger or Ledger(storage)
    requeued = []
    rows = _ended_unreported(ledger, reported) if jobs is None else jobs
    for job in rows:
        if job.status not in TERMINAL_JOB or job.status == JobState.REJECTED:
            continue
        if job.reported:
            continue
        if job.report_claimed and time.time() - job.report_claimed < stale_s:
            continue
        finished = parse_iso(job.finished_at or None)
        if finished is not None and (datetime.now(UTC) - finished).total_seconds() < stale_s:
            continue  # the collect function's own message is probably still on its way
        request_report(storage, job.job_id)
        requeued.append(job.job_id)
    return requeued


def _ended_unreported(ledger: Ledger, reported: set[str] | None) -> list[JobRow]:
    """The rows of the jobs that ended in the last ``REPORT_WINDOW_S``, less those ``reported`` already
    names (the memo is updated: the reported ones added, the entries gone from the window dropped)."""
    if reported is None:
        return ledger.ended_jobs(REPORT_WINDOW_S)
    entries = ledger.index.ended_since(REPORT_WINDOW_S)
    reported &= {e.row_key for e in entries}
    rows = []
    for entry in entries:
        if entry.row_key in reported:
            continue
        job = ledger.job(entry.job_id)
        if job is None:
            ledger.index.mend(entry, None)
        elif job.reported:
            reported.add(entry.row_key)
        else:
            rows.append(job)
    return rows
