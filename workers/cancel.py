"""How a running attempt learns that its job was cancelled (``upwell cancel``).

``CancelWatch`` stands in for the stop event that ``run_payload`` polls: it is set when the agent
is stopping (preemption) or when the job row says "cancelled". The job row is read from the
launcher's tick (every few seconds, with the lease extension), so a cancel reaches a running
payload within one tick; the payload then checkpoints and exits as on a preemption. Given the agent's
``JobRows``, a tick takes a copy of the row read less than ``MAX_AGE_S`` ago (the delivery's own read,
or another slot's tick on the same job) instead of reading it again: a cancel then takes at most one
tick and ``MAX_AGE_S`` to arrive.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from upwell.ledger import Ledger
from workers.jobrows import JobRows

CANCELLED = "cancelled"
MAX_AGE_S = 1.0


class CancelWatch:
    """State: the agent's stop event, this attempt's ``cancelled`` event, and the ids it watches."""

    def __init__(self, ledger: Ledger, job_id: str, stop: threading.Event, rows: JobRows | None = None):
        self.ledger, self.job_id, self.stop, self.rows = ledger, job_id, stop, rows
        self.cancelled = threading.Event()

    def is_set(self) -> bool:
        return self.stop.is_set() or self.cancelled.is_set()

    def check(self) -> bool:
        if self.cancelled.is_set():
            return True
        job = self.rows.get(self.job_id, max_age_s=MAX_AGE_S) if self.rows else self.ledger.job(self.job_id)
        if job is not None and job.status == CANCELLED:
            self.cancelled.set()
        return self.cancelled.is_set()

    def ticker(self, extend: Callable[[], None]) -> Callable[[], None]:
        """The launcher's on_tick: extend the lease, then look for a cancel (a failed read waits a tick)."""
        def tick() -> None:
            extend()
            try:
                self.check()
            except Exception:  # noqa: BLE001 - a storage hiccup must not stop the payload
                pass
        return tick
