"""The agent's copies of job rows: read once per job and reused for a bounded time.

Most of what the agent reads from a job row is fixed at ingest (payload, pool, budget, caps, the
definition, the manifest hash, the price key). What changes is the go/no-go: ``status`` (cancelled),
``spent_usd`` (over budget), ``killed_at`` and the wall-clock limit. Each of those only moves towards
"stop", except a re-run, which puts a job back to accepted. So a copy younger than ``ttl_s`` is used as
it is, and an older one is read again: a cancel, a kill or a spent budget reaches a new delivery within
``ttl_s`` (0: every delivery reads the row, as before this cache). A shard row that has been re-run more
often than the copy knows of (``ShardRow.reruns``) makes the copy stale at once, so a re-run is never
judged on the row from before it. Slots that find the copy stale at once share one read (``refresh``).

State: job id -> (row, when it was read), and the reads in flight, under one lock (the agent's slots share it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from upwell.ledger import JobRow, ShardRow

_KEEP = 256  # job ids remembered; the oldest copy goes first


class _Flight:
    """One read of a job row in flight: the callers waiting on it, and its answer once ``done``."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.waiters = 0
        self.row: JobRow | None = None
        self.ok = False


class JobRows:
    def __init__(self, read: Callable[[str], JobRow | None], ttl_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.read, self.ttl_s, self.clock = read, ttl_s, clock
        self._rows: dict[str, tuple[JobRow, float]] = {}
        self._flights: dict[str, _Flight] = {}  # job id -> the read of it in flight
        self._lock = threading.Lock()
        self.reads = 0

    def get(self, job_id: str, *, shard: ShardRow | None = None, max_age_s: float | None = None) -> JobRow | None:
        """The job row, read again when the copy is older than ``max_age_s`` (default ``ttl_s``) or
        older than the shard's last re-run; None when the job has no row."""
        limit = self.ttl_s if max_age_s is None else min(max_age_s, self.ttl_s)
        with self._lock:
            held = self._rows.get(job_id)
        if held is not None:
            row, at = held
            fresh = self.clock() - at < limit
            if fresh and (shard is None or shard.reruns <= row.reruns):
                return row
        row = self.refresh(job_id)
        if row is not None and shard is not None and shard.reruns > row.reruns:
            row = self._read(job_id, None)  # a read joined in flight was sent before the re-run: read it now
        return row

    def refresh(self, job_id: str) -> JobRow | None:
        """Read the row now; a caller that asks while another slot's read of the same job is in flight waits
        for that read instead of sending its own (its answer is at most one request older than its own would be:
        slots that start together on one job send one read, not one each)."""
        with self._lock:  # lead a read of the job, or join the one in flight
            flight = self._flights.get(job_id)
            if flight is None:
                flight = self._flights[job_id] = _Flight()
                lead = True
            else:
                flight.waiters += 1
                lead = False
        if lead:
            return self._read(job_id, flight)
        flight.done.wait()
        if flight.ok:
            return flight.row
        return self._read(job_id, None)  # the read it waited on failed: its own read raises the error

    def _read(self, job_id: str, flight: _Flight | None) -> JobRow | None:
        """One read of the row, kept as the copy; ``flight``: the read this one leads, answered and ended."""
        at = self.clock()
        try:
            row = self.read(job_id)
            with self._lock:
                self.reads += 1
                if row is None:
                    self._rows.pop(job_id, None)
                else:
                    self._rows[job_id] = (row, at)
                    while len(self._rows) > _KEEP:
                        self._rows.pop(next(iter(self._rows)))
            if flight is not None:
                flight.row, flight.ok = row, True
            return row
        finally:
            if flight is not None:
                with self._lock:
                    self._flights.pop(job_id, None)
                flight.done.set()

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._rows.pop(job_id, None)
