"""The node clock of a machine that local nodes share (``upwell up``): a wait for a CPU is not node time.

Every local "node" is a process on this one machine, so a shard's wall time depends on what else ran
beside it. Linux keeps, for every task, how long it waited for a CPU while ready to run: its run-queue
delay (``/proc/<pid>/schedstat``, second field, in ns). ``RunQueueClock`` reads it for a payload's
processes (``watch``) and for the agent's slot thread while it stages in (``thread_waited``); the agent
takes both off the shard's node time, so a local shard costs what its work costs. Chosen at the agent's
start-up by ``workers.supervision.node_clock``; a node of its own (Azure) never imports this module.
"""

from __future__ import annotations

import threading
import time

from workers.procs import descendants


class PayloadWait:
    """How long a payload waited for a CPU while it was ready to run: the run-queue delay of the payload's
    process and, once a second, of its descendants (MPI ranks); the figure is the most any one of them
    waited, since the slowest rank sets the pace. Zero without /proc.

    State: the last reading per pid, the descendants last found and when."""

    TREE_S = 1.0

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.waited: dict[int, int] = {}  # pid -> ns, the last reading
        self._tree: list[int] = []
        self._tree_at = time.monotonic()  # the first look for descendants a second in: a short payload has none

    def sample(self, now: float) -> None:
        if now - self._tree_at >= self.TREE_S:
            self._tree, self._tree_at = descendants(self.pid), now
        for pid in (self.pid, *self._tree):
            ns = run_delay_ns(f"/proc/{pid}/schedstat")
            if ns is not None:
                self.waited[pid] = max(self.waited.get(pid, 0), ns)

    @property
    def seconds(self) -> float:
        return max(self.waited.values(), default=0) / 1e9


class RunQueueClock:
    """The shared machine's node clock (``workers.supervision.NodeClock``); it keeps no state."""

    def watch(self, pid: int) -> PayloadWait:
        return PayloadWait(pid)

    def thread_waited(self) -> float:
        """Seconds the calling thread has waited for a CPU while ready to run; 0 without /proc."""
        return (run_delay_ns(f"/proc/self/task/{threading.get_native_id()}/schedstat") or 0) / 1e9


def run_delay_ns(schedstat: str) -> int | None:
    """A task's run-queue delay in ns, the second field of its schedstat file; None when it cannot be read."""
    try:
        with open(schedstat, "rb") as handle:
            return int(handle.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None
