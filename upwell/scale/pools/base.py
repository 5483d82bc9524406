"""The worker-pool contract: one small base class per backend family.

A backend translates its native node states into NodeState through its own
``translate_table`` and implements ``scale_to``, ``status`` and ``close``.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from enum import Enum


class NodeState(str, Enum):
    PENDING = "pending"  # asked for, not yet booted (allocating, creating, starting)
    IDLE = "idle"  # booted, running no task
    RUNNING = "running"  # running a task
    PREEMPTED = "preempted"  # spot node taken back
    FAILED = "failed"
    STOPPING = "stopping"  # leaving the pool (deallocating, deleting)
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class PoolSpec:
    """One pool's configuration, read once from settings (UPWELL_POOLS)."""

    name: str
    backend: str = "local"
    vm_size: str = "local"
    tasks_per_node: int = 1
    min_nodes: int = 0
    max_nodes: int = 2
    spot_share: float = 0.0  # fraction of nodes asked for as spot
    price_key: str = "local"
    activation_threshold: int = 1
    max_step: int = 10
    scale_down_votes: int = 3
    cooldown_s: float = 60.0
    budget_usd: float | None = None
    max_wall_clock_s: float | None = None  # a job on this pool runs at most this long (the kill switch)
    max_shard_wall_clock_s: float | None = None  # one attempt of a shard runs at most this long
    options: dict = field(default_factory=dict)  # backend-specific: image, identity, subnet ...


@dataclass(frozen=True)
class PoolStatus:
    """What a backend observes now. ``nodes`` maps a node id to its state."""

    name: str
    target: int
    nodes: dict[str, NodeState] = field(default_factory=dict)
    spot: int = 0
    dedicated: int = 0
    preempted: int = 0
    message: str = ""  # a human note, e.g. a quota or capacity shortfall

    def count(self, *states: NodeState) -> int:
        return sum(1 for s in self.nodes.values() if s in states)

    @property
    def alive(self) -> int:
        return self.count(NodeState.PENDING, NodeState.IDLE, NodeState.RUNNING)

    @property
    def idle(self) -> int:
        return self.count(NodeState.IDLE)


class WorkerPool(abc.ABC):
    """A group of worker nodes. Subclasses keep only handles to their backend."""

    translate_table: dict[str, NodeState] = {}

    def __init__(self, spec: PoolSpec):
        self.spec = spec

    def translate(self, native: str) -> NodeState:
        return self.translate_table.get(str(native).lower(), NodeState.UNKNOWN)

    @abc.abstractmethod
    def scale_to(self, n: int, *, spot: int | None = None) -> None:
        """Ask for n nodes, ``spot`` of them spot (None: the backend's split).

        Scale-in removes idle nodes only; it must not kill a running task."""

    @abc.abstractmethod
    def status(self) -> PoolStatus:
        """Observe the pool now."""

    def close(self) -> None:  # noqa: B027 - optional for backends that hold nothing
        """Release handles (and, for local pools, stop children)."""
