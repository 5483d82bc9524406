"""A pool that lives in memory, for the autoscaler tests that need what the local pool cannot do:
fail on demand (``fail_next``) and report a quota. Everything else is tested on the real local pool.

It keeps the contract of upwell.pools.base: scale-in removes idle nodes only, never one in the busy
set, and ``scale_to`` raises PoolError when told to fail. It lives with the tests because no
production code uses it.
"""

from __future__ import annotations

import itertools

from upwell.errors import PoolError
from upwell.pools.base import Busy, Gangs, NodeState, PoolSpec, PoolStatus, WorkerPool


class StubPool(WorkerPool):
    """State: node id -> NodeState, the busy set last passed in, every ``scale_to`` call, and
    an optional error to raise from the next ``scale_to`` (``fail_next``)."""

    translate_table = {"idle": NodeState.IDLE, "running": NodeState.RUNNING}
    expected_boot_s = 0.0

    def __init__(self, spec: PoolSpec, *, quota: dict | None = None) -> None:
        super().__init__(spec)
        self.nodes: dict[str, NodeState] = {}
        self.busy: set[str] = set()
        self.calls: list[tuple[int, int | None]] = []
        self.fail_next: PoolError | None = None
        self._quota = quota or {}
        self._ids = itertools.count(1)

    def scale_to(self, n: int, *, spot: int | None = None, busy: Busy = None, gangs: Gangs = None) -> None:
        self.calls.append((n, spot))
        self.busy = set(busy or ())
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        while len(self.nodes) < n:
            self.nodes[f"{self.spec.name}-{next(self._ids)}"] = NodeState.IDLE
        removable = [node for node, state in self.nodes.items()
                     if state is NodeState.IDLE and node not in self.busy]
        for node in removable[: max(0, len(self.nodes) - n)]:
            del self.nodes[node]

    def status(self, *, busy: Busy = None) -> PoolStatus:
        if busy is not None:
            self.busy = set(busy)
        nodes = {node: NodeState.RUNNING if node in self.busy else state for node, state in self.nodes.items()}
        return PoolStatus(self.spec.name, target=len(nodes), nodes=nodes, dedicated=len(nodes))

    def quota(self) -> dict:
        return dict(self._quota)
