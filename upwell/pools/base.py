"""The worker-pool contract: one small base class per backend family (see WorkerPool).

A backend translates its native node states into NodeState through its own
``translate_table`` and implements ``scale_to``, ``status``, and where it has them
``quota`` and ``close``. ``upwell.pools.process.LocalPool`` keeps it with processes on this machine.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar

from upwell import logs
from upwell.settings import PoolSpec  # settings data; the backends read it

log = logs.get("upwell.pools")


class NodeState(str, Enum):
    PENDING = "pending"  # asked for, not yet booted (allocating, creating, starting)
    IDLE = "idle"  # booted, running no task
    RUNNING = "running"  # running a task
    PREEMPTED = "preempted"  # spot node taken back
    FAILED = "failed"
    STOPPING = "stopping"  # leaving the pool (deallocating, deleting)
    UNKNOWN = "unknown"


def split(n: int, spot_share: float) -> tuple[int, int]:
    """(spot, dedicated) for n nodes at a spot share; rounds half toward dedicated. The policy
    plans with it and a backend asked for n nodes without a split uses it, so both agree."""
    spot = min(n, max(0, math.floor(n * spot_share + 0.5 - 1e-9)))
    return spot, n - spot


def agent_slots(spec: PoolSpec) -> int:
    """Shards one node's agent runs at once (UPWELL_SLOTS): the pool's tasks per node; 1 on an MPI pool,
    whose shard has the whole node."""
    if spec.options.get("mpi", spec.name == "mpi"):
        return 1
    return max(int(spec.tasks_per_node or 1), 1)


def warm_wanted(spec: PoolSpec, warm_live: int) -> int:
    """How many of the next one-node agents a pool starts must be warm: the first ``min_nodes`` agents are
    (issue 25 item 15), so that ``warm_live`` already running leave ``min_nodes - warm_live``."""
    return max(0, int(spec.min_nodes) - warm_live)


def warm_idle_exit_s(spec: PoolSpec) -> float:
    """A warm agent's idle exit (its ``--idle-exit``): ``options.warm_idle_exit_s``, default 0, which the
    agent reads as never; it then runs until scale-in drains it, which takes the other idle agents first."""
    return float(spec.options.get("warm_idle_exit_s", 0))


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


Busy = Collection[str] | None  # node ids the ledger shows running a shard; None: not known
# Gang allocations the backlog wants, by their node count k > 1 (k -> how many): shards of k nodes
# (upwell.shape) run one per allocation of k nodes. Counted within scale_to's n; None or {}: none.
Gangs = Mapping[int, int] | None


def refuse_gangs(spec: PoolSpec, gangs: Gangs) -> None:
    """For a backend that runs one node per shard (VMSS, ACI): raise PoolError when ``gangs`` asks for any
    allocation of several nodes. Ingest refuses such shards on these pools (upwell.shape.GangUnsupported), so
    one reaching here is a bug upstream, and no request is built for it."""
    asked = {int(k): int(m) for k, m in (gangs or {}).items() if m}
    if asked:
        from upwell.errors import PoolError

        wanted = ", ".join(f"{m} of {k} nodes" for k, m in sorted(asked.items()))
        raise PoolError(f"pool {spec.name!r} ({spec.backend}) runs one node per shard and was asked for gang "
                        f"allocations ({wanted}); shards of several nodes run only on a slurm or batch pool")


class WorkerPool(abc.ABC):
    """A group of worker nodes. Subclasses keep only handles to their backend.

    The contract, which every backend keeps:

    - ``scale_to(n, spot=, busy=, gangs=)`` asks for n nodes and returns without waiting for them;
      ``gangs`` says how many of them the backlog wants as allocations of k nodes each (only the
      gang backends, Slurm and Batch, ever get any: ingest refuses several nodes elsewhere);
      scale-in removes idle nodes only, never one in ``busy`` (with ``busy=None`` the backend
      cannot tell, so it treats every booted node as busy);
    - ``status(busy=)`` observes the pool now; a node in ``busy`` reads RUNNING;
    - ``quota()`` says how much more the account may hold: ``{"family", "cores", "spot_cores"}``
      (free vCPUs, None where not known); ``{}`` when the backend has no quota;
    - ``boot_s()`` is the expected time from asking for a node to its agent taking work
      (``expected_boot_s``, or ``options.boot_s`` in UPWELL_POOLS);
    - every failure of the backend raises PoolError (upwell.errors), never an SDK error;
    - ``node_state`` maps a native state through ``translate_table``; one it does not know is
      UNKNOWN and logged once per pool;
    - constructors take explicit keywords only (see upwell.pools.KEYWORDS);
    - where ``removes_by_id``: ``remove(ids, dead=)`` removes exactly those nodes now (a dead agent's node,
      or a drained one: the scaler's node step, ``upwell.scale.nodes``, decides which), and ``drain(ids)``
      signals those nodes' agents where the backend can reach them (the nodes table's mark reaches all).

    The busy set is observed once per scale run by the caller (the Autoscaler reads the
    ledger) and passed in: a backend never reads the ledger itself.
    """

    translate_table: ClassVar[dict[str, NodeState]] = {}
    expected_boot_s: ClassVar[float] = 360.0  # a cloud VM: allocate, boot, pull the image, start the agent

    def __init__(self, spec: PoolSpec):
        self.spec = spec
        self._unknown_logged: set[str] = set()

    def node_state(self, native: str) -> NodeState:
        key = str(native).lower()
        state = self.translate_table.get(key)
        if state is None:
            state = NodeState.UNKNOWN
            if key not in self._unknown_logged:
                self._unknown_logged.add(key)
                log.warning("pool.unknown_native_state", pool=self.spec.name, backend=self.spec.backend,
                            native=str(native)[:100])
        return state

    def boot_s(self) -> float:
        return float(self.spec.options.get("boot_s", self.expected_boot_s))

    def quota(self) -> dict[str, Any]:
        """Free quota: {"family", "cores", "spot_cores"}; {} when the backend has none. Raises PoolError."""
        return {}

    @abc.abstractmethod
    def scale_to(self, n: int, *, spot: int | None = None, busy: Busy = None, gangs: Gangs = None) -> None:
        """Ask for n nodes, ``spot`` of them spot (None: the backend's split). Raises PoolError.

        Scale-in removes idle nodes only; it must not kill a running task."""

    @abc.abstractmethod
    def status(self, *, busy: Busy = None) -> PoolStatus:
        """Observe the pool now. Raises PoolError."""

    removes_by_id: ClassVar[bool] = False  # remove() and drain() below; the scaler drains before scale-in

    def remove(self, node_ids: Collection[str], *, dead: bool = False) -> None:
        """Remove these nodes by id now: their agents are dead (``dead``: stop what still runs there, its
        leases come back through visibility) or drained (they hold nothing). A node already gone is not an
        error. Raises PoolError."""
        from upwell.errors import PoolError

        raise PoolError(f"pool {self.spec.name!r} ({self.spec.backend}) does not remove nodes by id")

    def drain(self, node_ids: Collection[str]) -> None:  # noqa: B027 - most agents read the mark at their beat
        """Tell these nodes' agents to drain now, where the backend can signal them; the nodes table's mark
        (``upwell.nodelog``) reaches every agent at its next beat anyway."""

    def close(self) -> None:  # noqa: B027 - optional for backends that hold nothing
        """Release handles (and, for local pools, stop children)."""
