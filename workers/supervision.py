"""The agent's supervision of what runs on its node: signals, cancel and node time.

- **Signals** (``install_signals``): SIGTERM/SIGINT (spot eviction, scale-in of a busy node) set ``stop``:
  every running payload is stopped and checkpoints, and its message goes back. SIGUSR1 sets ``drain``:
  finish the items in hand, then exit. Each also sets the agent's ``quit``, which ends a wait for a reboot
  to be over (``workers.eviction.watched``).
- **Cancel** (``CancelWatch``): how a running attempt learns of ``upwell cancel``.
- **Node time** (``NodeClock``), chosen once at start-up by ``node_clock``. On Azure a node's cores are its
  own: ``WallClock`` watches nothing and takes nothing off. Where local nodes share one machine (the
  shared-machine setting, ``workers.agent_config.SHARED_MACHINE``, which ``upwell up`` sets),
  ``upwell.local.cpuwait`` counts the time a payload and the agent's staging waited for a CPU that
  another "node" held: not node time.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Protocol

from upwell.ledger import Ledger
from upwell.rows import JobState
from workers.jobrows import JobRows

CANCEL_MAX_AGE_S = 1.0  # a running attempt's tick reuses a job row read this recently (workers.jobrows)


def install_signals(stop: threading.Event, drain: threading.Event, quit_: threading.Event) -> None:
    """In the agent's main thread: SIGTERM and SIGINT preempt (``stop``), SIGUSR1 drains (``drain``); each
    also sets ``quit_`` first (the agent is to end: it does not wait out a reboot, workers.eviction)."""
    def on(event: threading.Event):
        return lambda *_: (quit_.set(), event.set())

    signal.signal(signal.SIGTERM, on(stop))
    signal.signal(signal.SIGINT, on(stop))
    signal.signal(signal.SIGUSR1, on(drain))


class CancelWatch:
    """Stands in for the stop event that ``run_payload`` polls: set when the agent is stopping
    (preemption) or when the job row says "cancelled". The job row is read from the launcher's tick
    (every few seconds, with the lease extension), so a cancel reaches a running payload within one tick;
    the payload then checkpoints and exits as on a preemption. Given the agent's ``JobRows``, a tick takes
    a copy of the row read less than ``CANCEL_MAX_AGE_S`` ago (the delivery's own read, or another slot's
    tick on the same job) instead of reading it again: a cancel then takes at most one tick and that long.

    State: the agent's stop event, this attempt's ``cancelled`` event, and the job it watches."""

    def __init__(self, ledger: Ledger, job_id: str, stop: threading.Event, rows: JobRows | None = None):
        self.ledger, self.job_id, self.stop, self.rows = ledger, job_id, stop, rows
        self.cancelled = threading.Event()

    def is_set(self) -> bool:
        return self.stop.is_set() or self.cancelled.is_set()

    def check(self) -> bool:
        if self.cancelled.is_set():
            return True
        job = self.rows.get(self.job_id, max_age_s=CANCEL_MAX_AGE_S) if self.rows else self.ledger.job(self.job_id)
        if job is not None and job.status == JobState.CANCELLED:
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


class PayloadWatch(Protocol):
    """One payload's CPU wait, sampled by the launcher's supervision loop (``workers.payload_process``)."""

    def sample(self, now: float) -> None: ...

    @property
    def seconds(self) -> float: ...


class NodeClock(Protocol):
    """What of an attempt's wall time is not node time: ``watch`` a payload process (None: nothing to
    watch), and ``thread_waited``, the seconds the calling thread has waited for a CPU so far."""

    def watch(self, pid: int) -> PayloadWatch | None: ...

    def thread_waited(self) -> float: ...


class WallClock:
    """A node whose cores are its own (Azure, Slurm, a laptop running one worker): all wall time is node
    time, so there is nothing to watch and nothing to take off."""

    def watch(self, pid: int) -> None:
        return None

    def thread_waited(self) -> float:
        return 0.0


def node_clock(shared_machine: bool) -> NodeClock:
    """The node clock, chosen once at the agent's start-up from the shared-machine setting."""
    if not shared_machine:
        return WallClock()
    from upwell.local.cpuwait import RunQueueClock  # local-only machinery: a node of its own never loads it

    return RunQueueClock()
