"""The ingest's side of ``after: <job name or id>``: whether a manifest's job may start now.

``gate`` answers "go" (no ``after:``, or the parent succeeded: the parent's results folder becomes each
shard's input), "waiting" (the parent has not ended, or no job of that name exists yet: the job row waits
with the reason), or "cancelled" (the parent ended without succeeding: the child is cancelled, with the
reason). A manifest whose ``after:`` leads back to itself, through any number of waiting jobs, is refused
(InputRejected, field ``after``): a cycle could never start.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from upwell.after import state
from upwell.errors import InputRejected
from upwell.ledger import JobState, Ledger
from upwell.rows import JobRow
from upwell.timeutil import now_iso

MAX_DEPTH = 100  # links followed looking for a cycle
NAME_LOOKUP_S = 60.0  # a waiting child looks its parent up by name (a table read) at most this often


@dataclass(frozen=True)
class Gate:
    kind: str  # "go" | "waiting" | "cancelled"
    parent: str = ""  # the parent job's id, once known
    message: str = ""


def gate(ledger: Ledger, job: dict) -> Gate:
    """Decide for the job row ``job`` (its fields as ingest built them, ``after_parent`` among them); writes
    the waiting or cancelled row itself."""
    ref = str(job.get("after_parent") or "")
    if not ref:
        return Gate("go")
    me, name = job["job_id"], str(job.get("name") or "")
    if ref in (me, name):
        raise InputRejected(f"after: {ref!r} is this job itself; a job cannot wait on itself", field="after")
    existing = ledger.job(me)
    parent, looked = _resolve(ledger, ref, existing, me)
    if parent is None:
        return _wait(ledger, job, existing, "", f"waiting for job {ref!r}, which has not been submitted yet",
                     looked=looked)
    _refuse_cycle(ledger, parent, me, name)
    state.add_child(ledger, parent.job_id, me)
    if parent.status == JobState.SUCCEEDED:
        job.update(after_parent_id=parent.job_id, chain_state="started")
        return Gate("go", parent.job_id)
    if parent.terminal or parent.status == JobState.CANCELLED:
        return _cancel(ledger, job, existing, parent)
    return _wait(ledger, job, existing, parent.job_id,
                 f"waiting for job {parent.job_id} ({parent.name or ref}) to succeed; it is {parent.status.value}")


def _resolve(ledger: Ledger, ref: str, existing: JobRow | None, me: str) -> tuple[JobRow | None, bool]:
    """The parent: by the id resolved before, by id, else the newest job of that name (not a reduce); and
    whether the name was looked up (``after_checked`` records when it last was)."""
    known = state.field(existing, "after_parent_id") if existing is not None else ""
    row = ledger.job(known or ref) if "/" not in ref else None
    if row is not None:
        return row, False
    checked = float(state.field(existing, "after_checked") or 0) if existing is not None else 0.0
    if existing is not None and time.time() - checked < NAME_LOOKUP_S:
        return None, False  # looked up a moment ago; the parent's own end wakes this job (upwell.after.chains)
    # the job catalogue's jobs of that name, newest first: the first that is not a reduce (upwell.jobcatalog)
    named = (j for j in ledger.jobs(newest_first=True, name=ref) if j.job_id != me and not state.field(j, "reduce_of"))
    return next(named, None), True


def _refuse_cycle(ledger: Ledger, parent: JobRow, me: str, name: str) -> None:
    seen, row = [parent.job_id], parent
    for _ in range(MAX_DEPTH):
        up = state.field(row, "after_parent")
        if not up:
            return
        if up in (me, name) or state.field(row, "after_parent_id") == me:
            chain = " -> ".join([name or me, *seen, name or me])
            raise InputRejected(f"after: {parent.job_id!r} waits, through {len(seen)} job(s), on this job: "
                                f"a cycle ({chain}) would never start", field="after")
        row = ledger.job(state.field(row, "after_parent_id") or up)
        if row is None or row.job_id in seen:
            return
        seen.append(row.job_id)


def _wait(ledger: Ledger, job: dict, existing: JobRow | None, parent_id: str, message: str,
          looked: bool = True) -> Gate:
    """The job waiting. ``looked``: the parent's name was looked up just now. A check that skipped the lookup
    leaves ``after_checked`` where it was: moved on at every check, it would hold off the next lookup for as
    long as checks come more often than NAME_LOOKUP_S (the scale timer's recheck of waiting jobs does). A
    parent not found leaves ``after_parent_id`` alone: the parent's end may have set it since ``existing`` was
    read (``upwell.after.chains.wake``), and writing "" over it would lose that wake-up."""
    fields = {"message": message, "message_at": now_iso(), "chain_state": "waiting",
              **({"after_parent_id": parent_id} if parent_id or existing is None else {}),
              **({"after_checked": time.time()} if looked else {})}
    if existing is None:
        ledger.create_job(JobRow.from_entity({**job, **fields, "status": JobState.WAITING.value, "shards_total": 0}))
    else:
        ledger.update_job(job["job_id"], **fields)
    return Gate("waiting", parent_id, message)


def _cancel(ledger: Ledger, job: dict, existing: JobRow | None, parent: JobRow) -> Gate:
    message = (f"cancelled: job {parent.job_id} ({parent.name or '-'}), which this job waited for, ended "
               f"{parent.status.value} without succeeding"
               + (f": {parent.message[:300]}" if parent.message else ""))
    fields = {"status": JobState.CANCELLED.value, "message": message, "message_at": now_iso(),
              "cancelled_at": now_iso(), "after_parent_id": parent.job_id, "chain_state": "cancelled"}
    if existing is None:
        ledger.create_job(JobRow.from_entity({**job, **fields, "shards_total": 0}))
    else:
        ledger.update_job(job["job_id"], **fields)
    return Gate("cancelled", parent.job_id, message)
