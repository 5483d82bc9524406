"""The job-done transition's consequences, run by upwell.results.publish for a terminal job: the job's
reduce starts, a finished reduce is recorded on its parent, the events it owes are queued, and the jobs
waiting on it (``after:``) start or are cancelled. Each step is guarded by the job rows' state, so a
duplicate "done" repeats nothing.
"""

from __future__ import annotations

from upwell import logs
from upwell.after import chains, notify, reduce
from upwell.after.spec import of_job
from upwell.errors import UpwellError
from upwell.ledger import Ledger
from upwell.rows import JobRow
from upwell.settings import Settings
from upwell.storage import Storage

log = logs.get("upwell.after.hook")


def job_done(storage: Storage, ledger: Ledger, job: JobRow, settings: Settings | None = None) -> list[str]:
    """Act on ``job`` having ended; the ids of other jobs whose report must be built again (a reduce's
    parent). A transient error raises (the report message comes again); a notification never does."""
    settings = settings or Settings.from_env()
    ask = of_job(job)
    if ask.reduce is not None:
        reduce.begin(storage, settings, ledger, job, ask.reduce)
    parent = reduce.finish(ledger, job)
    try:
        notify.enqueue(storage, ledger, job, ask.notify)
    except UpwellError as exc:  # a notification must never cost the job its report or its chain
        log.warning("after.notify_not_queued", job_id=job.job_id, error=str(exc)[:300])
    chains.wake(storage, settings, ledger, job)
    return [parent] if parent else []
