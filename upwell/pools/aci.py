"""Azure Container Instances backend (azure-mgmt-containerinstance): one group per worker.

``scale_to(n)`` first deletes finished groups (restart policy Never: an agent
that exited, idle or failed, never runs again), then creates groups up to n,
or deletes groups that hold no shard down to n (booting ones first). Busy
groups are the ``busy`` set passed in (node ids the ledger shows running; a
group's agent records the group name as UPWELL_NODE_ID); with ``busy=None`` a
running group counts as busy and only finished or booting groups go.

By id (``remove``, the scaler's node step): the group of a dead agent or a drained one is deleted
(DELETE .../containerGroups/{name}; volumes the user provided stay); a node id is the group's name.

Creation and deletion are long-running ARM operations; ``scale_to`` starts them
and returns, and a failure that comes later shows on ``status().message``.
State kept: the spec, a lazily built client, the pollers.
"""

from __future__ import annotations

from typing import Any

from upwell import logs
from upwell.pools import azure_common as az
from upwell.pools import build_aci as build
from upwell.pools.azure_errors import pool_error
from upwell.pools.base import Busy, Gangs, NodeState, PoolStatus, refuse_gangs, split, warm_wanted

log = logs.get("upwell.pools.aci")
_ALIVE = (NodeState.PENDING, NodeState.IDLE, NodeState.RUNNING)
_FINISHED = (NodeState.STOPPING, NodeState.FAILED)


def _warm(group) -> bool:
    """A group started as one of the first min_nodes (build_aci.WARM_TAG)."""
    return (group.tags or {}).get(build.WARM_TAG) == "1"


class AciPool(az.ArmPool):
    translate_table = {
        "creating": NodeState.PENDING, "pending": NodeState.PENDING, "accepted": NodeState.PENDING,
        "waiting": NodeState.PENDING, "repairing": NodeState.PENDING, "running": NodeState.IDLE,
        "succeeded": NodeState.STOPPING, "stopped": NodeState.STOPPING, "terminated": NodeState.STOPPING,
        "deleting": NodeState.STOPPING, "canceled": NodeState.FAILED, "failed": NodeState.FAILED,
        "unknown": NodeState.UNKNOWN,
    }

    def _client_class(self) -> type:
        from azure.mgmt.containerinstance import ContainerInstanceManagementClient

        return ContainerInstanceManagementClient

    def _groups(self, busy: set[str] | None) -> list[tuple[Any, NodeState]]:
        """This pool's groups with their states (a GET fills in a missing instance view)."""
        out = []
        for group in self.client.container_groups.list_by_resource_group(self.rg):
            if (group.tags or {}).get("upwell-pool") != self.spec.name:
                continue
            native = build.group_state(group)
            if native == "unknown":
                group = self.client.container_groups.get(self.rg, group.name)
                native = build.group_state(group)
            state = self.node_state(native)
            if state is NodeState.IDLE and (busy is None or group.name in busy):
                state = NodeState.RUNNING
            out.append((group, state))
        return out

    def scale_to(self, n: int, *, spot: int | None = None, busy: Busy = None, gangs: Gangs = None) -> None:
        """Ask for n workers, ``spot`` of them spot (default: spec.spot_share). One container group per shard:
        ``gangs`` with any allocation raises PoolError (upwell.pools.base.refuse_gangs)."""
        from azure.core.exceptions import AzureError

        refuse_gangs(self.spec, gangs)  # before any request: its builders know one node per shard only
        n = max(int(n), 0)
        spot = split(n, self.spec.spot_share)[0] if spot is None else min(max(int(spot), 0), n)
        try:
            groups = self._groups(az.busy_set(busy))
            for group, state in groups:
                if state in _FINISHED and build.group_state(group) != "deleting":
                    self._delete(group.name, "delete finished group")
            alive = [(g, s) for g, s in groups if s in _ALIVE]
            if len(alive) < n:
                alive_spot = sum(1 for g, _ in alive if str(g.priority or "").lower() == "spot")
                warm = warm_wanted(self.spec, sum(1 for g, _ in alive if _warm(g)))
                for i in range(n - len(alive)):
                    self._create(spot=i < spot - alive_spot, warm=i < warm)
            elif len(alive) > n:
                order = {NodeState.PENDING: 0, NodeState.IDLE: 1}  # booting first; the warm ones last
                victims = sorted((_warm(g), order[s], g.name) for g, s in alive if s in order)[: len(alive) - n]
                for _, _, name in victims:
                    self._delete(name, "delete idle group")
        except AzureError as exc:
            raise pool_error(exc, pool=self.spec.name, action=f"scale container groups to {n}") from None

    removes_by_id = True

    def remove(self, node_ids, *, dead: bool = False) -> None:
        """Delete this pool's groups named in ``node_ids`` (those still there); raises PoolError."""
        from azure.core.exceptions import AzureError

        try:
            for group, _ in self._groups(set()):
                if group.name in node_ids and build.group_state(group) != "deleting":
                    self._delete(group.name, "delete dead group" if dead else "delete drained group")
        except AzureError as exc:
            raise pool_error(exc, pool=self.spec.name, action="delete container groups by id") from None

    def _create(self, *, spot: bool, warm: bool) -> None:
        name = build.group_name(self.spec)
        self.pollers.add(f"create container group {name}", self.client.container_groups.begin_create_or_update(
            self.rg, name, build.container_group(self.spec, name, spot=spot, warm=warm)))
        log.info("aci.create", pool=self.spec.name, group=name, spot=spot, warm=warm)

    def _delete(self, name: str, why: str) -> None:
        self.pollers.add(f"{why} {name}", self.client.container_groups.begin_delete(self.rg, name))

    def status(self, *, busy: Busy = None) -> PoolStatus:
        from azure.core.exceptions import AzureError

        try:
            groups = self._groups(az.busy_set(busy))
        except AzureError as exc:
            raise pool_error(exc, pool=self.spec.name, action="list container groups") from None
        nodes = {g.name: s for g, s in groups}
        spot = sum(1 for g, s in groups if s in _ALIVE and str(g.priority or "").lower() == "spot")
        alive = sum(1 for _, s in groups if s in _ALIVE)
        error = self.pollers.check()
        return PoolStatus(self.spec.name, target=alive, nodes=nodes, spot=spot, dedicated=alive - spot,
                          message=str(error) if error else "")

