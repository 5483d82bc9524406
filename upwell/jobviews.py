"""The views of jobs that one process keeps between finishes: a first try for the next finish, never a truth.

Finishing a shard writes its job's counter row conditionally on the ETag the finisher holds, so it needs a
view of the job (``upwell.jobcounts``): read, that is one range query per finish. A process that collects
many results of one job (a Functions instance running collect) keeps instead the view its last finish left
(``Completion.view``: its own counter row with the ETag the service returned) and tries the next finish on
it. Nothing is decided on a kept view alone: every write is conditional on its ETags, so a row another
process changed since fails its condition and only that row is read again, and a job's end is still written
once, conditionally, after a fresh read (jobcounts' recheck). A kept view never delays a cancel: cancel is
the job row's status, which the agent reads and collect does not act on.

Finishes of one job that run at once in the process each leave a view; the kept one takes, per counter row,
the view that counted more on it (a counter only grows between folds; a fold deletes the rows, and a view
from before it fails its condition and is read again). At most ``MAX_JOBS`` jobs are kept, the least
recently used forgotten first, and a job whose view shows it ended is forgotten.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from upwell import counters
from upwell.rows import JobRow

MAX_JOBS = 256


class JobViews:
    """Kept views by job id, shared by the threads of one process."""

    def __init__(self, max_jobs: int = MAX_JOBS) -> None:
        self.max_jobs = max_jobs
        self._views: OrderedDict[str, JobRow] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, job_id: str) -> JobRow | None:
        with self._lock:
            view = self._views.get(job_id)
            if view is not None:
                self._views.move_to_end(job_id)
            return view

    def keep(self, job_id: str, view: JobRow | None) -> None:
        """Keep ``view`` for the next finish of ``job_id``; None, or an ended job, forgets the job."""
        with self._lock:
            if view is None or view.terminal or not view.etag:
                self._views.pop(job_id, None)
                return
            held = self._views.get(job_id)
            self._views[job_id] = view if held is None or held.etag != view.etag else _merged(held, view)
            self._views.move_to_end(job_id)
            while len(self._views) > self.max_jobs:
                self._views.popitem(last=False)


def _merged(held: JobRow, new: JobRow) -> JobRow:
    """``new`` with each counter row taken from whichever view counted more on it (ties: ``new``)."""
    rows = {c.key: c for c in held.counters}
    for c in new.counters:
        old = rows.get(c.key)
        if old is None or c.done + c.failed >= old.done + old.failed:
            rows[c.key] = c
    return counters.with_counters(new, rows.values())
