"""The after-job state on the job row, each change made under the row's ETag (``Ledger.change_job``), so
that of two deliveries of the same "done" only one moves a state on.

Fields (kept in the row's ``extra``, written back by every writer): ``analysis_state`` ("" | running |
succeeded | failed), ``analysis_job`` (the reduce job of the latest attempt), ``analysis_attempt``,
``analysis_error``, ``analysis_at`` (when the attempt was claimed); ``notify_sent`` (the events claimed,
comma-separated), ``notify_at`` (when the last were claimed), ``notify_queued`` (those whose message is
on the ``notify`` queue), ``notify_failed`` (the last delivery that failed for good); ``chain_state`` on a
child (waiting | started | cancelled). A claim is written before its effect, and the effect's mark after
it, so a crash in between leaves a state that ``upwell.after.recover`` finds and completes.
"""

from __future__ import annotations

import time
from typing import Any

from upwell.ledger import Ledger
from upwell.rows import JobRow

RUNNING, SUCCEEDED, FAILED = "running", "succeeded", "failed"


def field(job: JobRow, name: str) -> str:
    """One after-job field of a row, as text ("" when unset)."""
    value = (job.extra or {}).get(name)
    return "" if value is None else str(value)


def stamp(job: JobRow, name: str) -> float:
    """A claim's time (``analysis_at``, ``notify_at``); 0, so old, when the row predates it."""
    try:
        return float(field(job, name) or 0.0)
    except ValueError:
        return 0.0


def attempt(job: JobRow) -> int:
    try:
        return int(field(job, "analysis_attempt") or 0)
    except ValueError:
        return 0


def reduce_job_id(parent_id: str, n: int) -> str:
    """The reduce job of attempt ``n``: derived, so a repeated start finds the same job."""
    return f"{parent_id}-reduce{n}"


def claim_analysis(ledger: Ledger, job_id: str, *, again: bool = False) -> str | None:
    """Move the analysis to "running" with a new attempt; the reduce job id this caller must start, or None
    when another caller did (``again``: a rerun, allowed once the last attempt has ended)."""
    def change(row: JobRow) -> dict[str, Any] | None:
        state = field(row, "analysis_state")
        if state == RUNNING or (state and not again):
            return None
        n = attempt(row) + 1
        return {"analysis_state": RUNNING, "analysis_attempt": n, "analysis_job": reduce_job_id(job_id, n),
                "analysis_error": "", "analysis_at": time.time()}

    done = ledger.change_job(job_id, change)
    return str(done["analysis_job"]) if done else None


def end_analysis(ledger: Ledger, parent_id: str, reduce_id: str, ok: bool, error: str = "") -> bool:
    """Record the end of the reduce job ``reduce_id``; True for the one caller that moved it (an older
    attempt's end, or a second delivery of the same, changes nothing)."""
    def change(row: JobRow) -> dict[str, Any] | None:
        if field(row, "analysis_job") != reduce_id or field(row, "analysis_state") != RUNNING:
            return None
        return {"analysis_state": SUCCEEDED if ok else FAILED, "analysis_error": error[:2000]}

    return ledger.change_job(parent_id, change) is not None


def claim_events(ledger: Ledger, job_id: str, events: list[str]) -> list[str]:
    """Mark ``events`` as queued for the job; those this caller must send (none already sent)."""
    got: list[str] = []

    def change(row: JobRow) -> dict[str, Any] | None:
        sent = listed(row, "notify_sent")
        new = [e for e in events if e not in sent]
        got[:] = new
        return {"notify_sent": ",".join(sent + new), "notify_at": time.time()} if new else None

    return got if ledger.change_job(job_id, change) is not None else []


def listed(job: JobRow, name: str) -> list[str]:
    """A comma-separated after-job field as a list."""
    return [e for e in field(job, name).split(",") if e]


def mark_queued(ledger: Ledger, job_id: str, events: list[str]) -> None:
    """Note that the messages of ``events`` are on the ``notify`` queue (the end of a claim's effect)."""
    def change(row: JobRow) -> dict[str, Any] | None:
        queued = listed(row, "notify_queued")
        new = [e for e in events if e not in queued]
        return {"notify_queued": ",".join(queued + new)} if new else None

    ledger.change_job(job_id, change)


def set_fields(ledger: Ledger, job_id: str, **fields: Any) -> None:
    """Plain MERGE of after-job fields that no race can undo (a delivery's outcome, a chain's note)."""
    ledger.update_job(job_id, **fields)


def add_child(ledger: Ledger, parent_id: str, child_id: str) -> None:
    """Note on the parent that ``child_id`` waits on it or started after it (``upwell status`` shows the chain)."""
    def change(row: JobRow) -> dict[str, Any] | None:
        children = [c for c in field(row, "chain_children").split(",") if c]
        return None if child_id in children else {"chain_children": ",".join([*children, child_id])[:30000]}

    ledger.change_job(parent_id, change)
