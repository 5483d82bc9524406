"""Azure Batch backend: one Batch pool per upwell pool, the agent as its start task.

The pool is created once through ARM (only ARM can attach the worker's
user-assigned identity); after that the data plane (azure-batch 15.x
``BatchClient``) resizes it to target dedicated + spot (low-priority) nodes,
removes chosen idle nodes with ``taskcompletion`` (a node running a Batch task
finishes it first), and lists nodes.

A resize runs on Batch's side for minutes; ``scale_to`` starts it and returns
(the SDK's poller follows it on a daemon thread, kept as ``last_poller``). While
the pool is not steady, ``scale_to`` leaves it alone: the next evaluation acts.

Batch sees only Batch tasks: an agent started by the start task that is running
a shard still looks "idle" to Batch. The ``busy`` set passed in (node ids the
ledger shows running; the agent records AZ_BATCH_NODE_ID) makes such nodes
count as running, and they are never removed.

A gang pool (``options.gangs``) has no start-task agent: after the resize, ``scale_to`` adds the agent
tasks the backlog wants to the pool's one job (upwell.pools.batch_tasks): one multi-instance task of k
nodes per wanted gang of k, and a plain task per one-node agent. Batch then sees every agent, so a node
running one reads "running", and it hands each node's one slot to one agent only.

By id (``remove``, the scaler's node step): a dead agent's node goes with ``terminate`` (Batch never sees a
start-task agent fail: ``waitForSuccess`` is false), a drained node with ``taskcompletion``; only nodes still
in the pool, and only while the pool is steady (Batch takes one resize at a time: the next run tries again).
Following Batch's remove-nodes operation (POST /pools/{poolId}/removenodes: ``nodeList`` of at most 100 ids,
``nodeDeallocationOption`` requeue | terminate | taskcompletion | retaineddata, ``resizeTimeout``).

State kept: the spec, lazily built SDK clients, the last poller, the agent tasks (gang pools).
"""

from __future__ import annotations

from typing import Any

from upwell import logs
from upwell.pools import azure_common as az
from upwell.pools import build_batch as build
from upwell.pools import build_batch_tasks as build_tasks
from upwell.pools.azure_errors import describe_resize_errors, pool_error
from upwell.pools.base import Busy, Gangs, NodeState, PoolSpec, PoolStatus, WorkerPool, split
from upwell.pools.batch_tasks import AgentTasks

log = logs.get("upwell.pools.batch")

# Which nodes go first when the pool shrinks: broken, then booting, then idle.
_REMOVAL_ORDER = {"starttaskfailed": 0, "unusable": 0, "offline": 0, "preempted": 1, "creating": 2,
                  "starting": 2, "waitingforstarttask": 2, "idle": 3}


class BatchPool(WorkerPool):
    translate_table = {
        "creating": NodeState.PENDING, "starting": NodeState.PENDING, "waitingforstarttask": NodeState.PENDING,
        "rebooting": NodeState.PENDING, "reimaging": NodeState.PENDING, "upgradingos": NodeState.PENDING,
        "idle": NodeState.IDLE, "running": NodeState.RUNNING, "preempted": NodeState.PREEMPTED,
        "starttaskfailed": NodeState.FAILED, "unusable": NodeState.FAILED, "offline": NodeState.FAILED,
        "leavingpool": NodeState.STOPPING, "deallocating": NodeState.STOPPING, "deallocated": NodeState.STOPPING,
        "unknown": NodeState.UNKNOWN,
    }

    def __init__(self, spec: PoolSpec, *, credential: Any = None, client: Any = None, arm_client: Any = None,
                 client_kwargs: dict | None = None):
        super().__init__(spec)
        self.pool_id = build.pool_id(spec)
        self._credential = credential
        self._client = client
        self._arm = arm_client
        self._kwargs = dict(client_kwargs or {})
        self.polling_interval = float(self._kwargs.pop("polling_interval", 30))
        self.last_poller = None
        self._created = False
        self._tasks: AgentTasks | None = None

    # -- clients ------------------------------------------------------------------------
    @property
    def client(self):
        if self._client is None:
            from azure.batch import BatchClient

            kw = {k: (list(v) if isinstance(v, list) else v) for k, v in self._kwargs.items() if k != "base_url"}
            self._client = BatchClient(endpoint=str(az.opt(self.spec, "account_url")),
                                       credential=self._cred(), **kw)
        return self._client

    def _cred(self):
        self._credential = az.credential(self._credential)
        return self._credential

    def _arm_client(self):
        if self._arm is None:
            kw = {k: (list(v) if isinstance(v, list) else v) for k, v in self._kwargs.items()}
            self._arm = az.arm_client(self._cred(), **kw)
        return self._arm

    # -- the contract -------------------------------------------------------------------
    def ensure(self) -> bool:
        """Create the pool through ARM if it does not exist; True if it was created."""
        from azure.core.exceptions import AzureError

        try:
            self._get_or_create(create=True)
        except AzureError as exc:
            raise pool_error(exc, pool=self.spec.name, action=f"create Batch pool {self.pool_id}") from None
        return self._created

    def _get_or_create(self, *, create: bool) -> Any:
        from azure.core.exceptions import ResourceNotFoundError

        self._created = False
        try:
            return self.client.get_pool(self.pool_id)
        except ResourceNotFoundError:
            if not create or not self.spec.options.get("create", True):
                raise
        az.arm_put(self._arm_client(), build.pool_path(self.spec), build.POOL_API_VERSION,
                   build.pool_body(self.spec), polling_interval=self.polling_interval)
        self._created = True
        log.info("batch.pool_created", pool=self.spec.name, pool_id=self.pool_id)
        return self.client.get_pool(self.pool_id)

    def scale_to(self, n: int, *, spot: int | None = None, busy: Busy = None, gangs: Gangs = None) -> None:
        """Ask for n nodes, ``spot`` of them spot (default: spec.spot_share). Growth resizes;
        shrinking removes chosen idle nodes only. On a gang pool, then add the agent tasks that n and
        ``gangs`` want beyond the live ones (even while a resize runs: a task waits for its nodes)."""
        from azure.core.exceptions import AzureError, ResourceNotFoundError

        n = max(int(n), 0)
        spot = split(n, self.spec.spot_share)[0] if spot is None else min(max(int(spot), 0), n)
        dedicated = n - spot
        try:
            try:
                pool = self._get_or_create(create=n > 0)
            except ResourceNotFoundError:
                return  # no pool and nothing asked for
            self._resize(pool, dedicated, spot, az.busy_set(busy) or set())
            if build.is_gang_pool(self.spec):
                self.agent_tasks.reconcile(build_tasks.wanted(n, gangs))
        except AzureError as exc:
            raise pool_error(exc, pool=self.spec.name, action=f"resize Batch pool {self.pool_id} to {n}") from None

    @property
    def agent_tasks(self) -> AgentTasks:
        if self._tasks is None:
            self._tasks = AgentTasks(self.client, self.spec)
        return self._tasks

    def _resize(self, pool: Any, dedicated: int, spot: int, busy: set[str]) -> None:
        state = _s(pool.allocation_state) or "steady"
        if state != "steady":
            log.info("batch.resize_deferred", pool=self.spec.name, allocation_state=state)
            return
        cur_d, cur_s = int(pool.target_dedicated_nodes or 0), int(pool.target_low_priority_nodes or 0)
        if (cur_d, cur_s) == (dedicated, spot):
            return
        grow_d, grow_s = max(dedicated, cur_d), max(spot, cur_s)
        if (grow_d, grow_s) != (cur_d, cur_s):
            # Growth first (work is waiting); a kind that should shrink keeps its target until the
            # next evaluation removes its idle nodes: Batch takes one resize at a time.
            self.last_poller = self.client.begin_resize_pool(
                self.pool_id, build.resize_options(self.spec, grow_d, grow_s), polling_interval=self.polling_interval)
            return
        victims = self._victims(cur_d - dedicated, cur_s - spot, busy)
        if victims:
            self.last_poller = self.client.begin_remove_nodes(
                self.pool_id, build.remove_options(self.spec, victims[:100]), polling_interval=self.polling_interval)

    def _victims(self, dedicated: int, spot: int, busy: set[str]) -> list[str]:
        candidates = sorted(
            (n for n in self.client.list_nodes(self.pool_id) if _s(n.state) in _REMOVAL_ORDER and n.id not in busy),
            key=lambda n: (_REMOVAL_ORDER[_s(n.state)], n.id))
        out, want = [], {True: dedicated, False: spot}
        for node in candidates:
            kind = bool(node.is_dedicated)
            if want[kind] > 0:
                out.append(node.id)
                want[kind] -= 1
        return out

    removes_by_id = True

    def remove(self, node_ids, *, dead: bool = False) -> None:
        """Remove these nodes of the pool by id (see the module docstring); raises PoolError."""
        from azure.core.exceptions import AzureError, ResourceNotFoundError

        from upwell.errors import PoolError, PoolErrorKind

        try:
            pool = self.client.get_pool(self.pool_id)
            if (_s(pool.allocation_state) or "steady") != "steady":
                raise PoolError(f"Batch pool {self.pool_id} is resizing; nodes are removed by id once it is steady",
                                kind=PoolErrorKind.THROTTLED)
            present = {n.id for n in self.client.list_nodes(self.pool_id)}
            ids = sorted(i for i in set(node_ids) if i in present)[:100]
            if ids:
                option = "terminate" if dead else build.DEALLOCATION
                self.last_poller = self.client.begin_remove_nodes(
                    self.pool_id, build.remove_options(self.spec, ids, option), polling_interval=self.polling_interval)
                log.info("batch.nodes_removed", pool=self.spec.name, nodes=ids, dead=dead)
        except ResourceNotFoundError:
            return  # no pool: nothing to remove
        except AzureError as exc:
            raise pool_error(exc, pool=self.spec.name, action=f"remove nodes of Batch pool {self.pool_id}") from None

    def status(self, *, busy: Busy = None) -> PoolStatus:
        from azure.core.exceptions import AzureError, ResourceNotFoundError

        try:
            try:
                pool = self.client.get_pool(self.pool_id)
            except ResourceNotFoundError:
                return PoolStatus(self.spec.name, target=0, message=f"Batch pool {self.pool_id} does not exist yet")
            nodes = list(self.client.list_nodes(self.pool_id))
        except AzureError as exc:
            raise pool_error(exc, pool=self.spec.name, action=f"read Batch pool {self.pool_id}") from None
        busy = az.busy_set(busy)
        states, spot, dedicated = {}, 0, 0
        for node in nodes:
            state = self.node_state(_s(node.state))
            if state is NodeState.IDLE and busy is not None and node.id in busy:
                state = NodeState.RUNNING
            states[node.id] = state
            if state in (NodeState.PENDING, NodeState.IDLE, NodeState.RUNNING):
                spot += not node.is_dedicated
                dedicated += bool(node.is_dedicated)
        _, message = describe_resize_errors(self.spec.name, list(pool.resize_errors or []))
        target = int(pool.target_dedicated_nodes or 0) + int(pool.target_low_priority_nodes or 0)
        preempted = sum(1 for s in states.values() if s is NodeState.PREEMPTED)
        return PoolStatus(self.spec.name, target=target, nodes=states, spot=spot, dedicated=dedicated,
                          preempted=preempted, message=message)

    def close(self) -> None:
        for c in (self._client, self._arm):
            if c is not None and hasattr(c, "close"):
                c.close()
        self._client = self._arm = None


def _s(value: Any) -> str:
    """An SDK enum or string as the lower-case native name ("idle", "steady")."""
    return str(getattr(value, "value", value) or "").lower()
