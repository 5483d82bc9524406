"""Jobs that start jobs, from the parent's side: when a job ends, every job waiting on it (``after:``
its id or its name) is ingested again, and its gate (``upwell.after.gate``) now starts it with the
parent's results as input, or cancels it with the reason. The child's ingest is idempotent (its job id is
its upload's), so a duplicate "done" starts nothing twice; the scale timer's pass over waiting manifests
(``upwell.ingest.ingestor.recheck_waiting``) re-drives a child whose wake-up was lost.
"""

from __future__ import annotations

from upwell import logs, names
from upwell.after import state
from upwell.ledger import JobState, Ledger
from upwell.rows import JobRow
from upwell.settings import Settings
from upwell.storage import Storage

log = logs.get("upwell.after.chains")


def waiting_on(ledger: Ledger, parent: JobRow) -> list[JobRow]:
    """The waiting jobs whose ``after:`` names ``parent`` (through the index of open jobs: no table scan)."""
    refs = {parent.job_id} | ({parent.name} if parent.name else set())
    return [j for j in ledger.open_jobs(JobState.WAITING)
            if state.field(j, "after_parent") in refs or state.field(j, "after_parent_id") == parent.job_id]


def wake(storage: Storage, settings: Settings, ledger: Ledger, parent: JobRow) -> list[str]:
    """Ingest again each job waiting on ``parent``; the children's ids and what became of them."""
    from upwell.ingest.ingestor import Ingestor

    if not parent.terminal:
        return []
    children = waiting_on(ledger, parent)
    if not children:
        return []
    ingestor = Ingestor(storage, settings, ledger)
    out = []
    for child in children:
        source = child.source_blob
        if not source.startswith(f"{names.INCOMING}/"):
            continue
        if not state.field(child, "after_parent_id"):  # it named the parent before the parent existed
            state.set_fields(ledger, child.job_id, after_parent_id=parent.job_id)
        outcome = ingestor.ingest(source[len(names.INCOMING) + 1:])
        log.info("chain.woken", job_id=child.job_id, parent=parent.job_id, outcome=outcome.status)
        out.append(f"{child.job_id}: {outcome.status}")
    return out
