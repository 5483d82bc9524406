"""VM Scale Set backend (azure-mgmt-compute): capacity up, chosen idle instances out.

Growth raises a scale set's capacity (PATCH sku.capacity). Shrinking never
lowers the capacity and lets Azure pick: it deletes specific instances that are
booting, broken or idle (``delete_instances``), so a VM whose agent is running
a shard stays. Which VMs are busy is the ``busy`` set passed in (node ids the
ledger shows running; the agent records the VM name as UPWELL_NODE_ID).
With ``busy=None`` every booted VM counts as running and nothing booted is
removed: a VM alone cannot tell whether its agent is idle.

By id (``remove``, the scaler's node step): the VMs of a dead agent or a drained one are deleted with
``delete_instances`` (POST .../virtualMachineScaleSets/{name}/delete with ``instanceIds``), which also lowers the
capacity; a node id is the VM's name, mapped to its scale set and instance id from the listing.

ARM operations are long-running; ``scale_to`` starts them and returns (the
SDK's pollers follow them on daemon threads, kept in ``pollers``); one that
fails later (AllocationFailed ...) shows on the next ``status().message``.
State kept: the spec, a lazily built ComputeManagementClient, the pollers.
"""

from __future__ import annotations

from typing import Any

from upwell import logs
from upwell.pools import azure_common as az
from upwell.pools import build_vmss as build
from upwell.pools.azure_errors import pool_error
from upwell.pools.base import Busy, Gangs, NodeState, PoolStatus, refuse_gangs, split

log = logs.get("upwell.pools.vmss")
_ALIVE = (NodeState.PENDING, NodeState.IDLE, NodeState.RUNNING)
_REMOVAL_ORDER = {NodeState.FAILED: 0, NodeState.UNKNOWN: 1, NodeState.PENDING: 2, NodeState.IDLE: 3}


class VmssPool(az.ArmPool):
    translate_table = {
        "creating": NodeState.PENDING, "updating": NodeState.PENDING, "starting": NodeState.PENDING,
        "running": NodeState.IDLE, "stopping": NodeState.STOPPING, "stopped": NodeState.STOPPING,
        "deallocating": NodeState.STOPPING, "deallocated": NodeState.STOPPING, "deleting": NodeState.STOPPING,
        "failed": NodeState.FAILED, "unknown": NodeState.UNKNOWN,
    }

    def _client_class(self) -> type:
        from azure.mgmt.compute import ComputeManagementClient

        return ComputeManagementClient

    # -- the contract -------------------------------------------------------------------
    def scale_to(self, n: int, *, spot: int | None = None, busy: Busy = None, gangs: Gangs = None) -> None:
        """Ask for n VMs, ``spot`` of them spot (default: spec.spot_share). One VM per shard: ``gangs`` with any
        allocation raises PoolError (upwell.pools.base.refuse_gangs)."""
        from azure.core.exceptions import AzureError

        refuse_gangs(self.spec, gangs)  # before any request: its builders know one node per shard only
        n = max(int(n), 0)
        want = self._per_set(n, spot)
        try:
            vms = self._vms()
            for (name, is_spot), count in want.items():
                self._scale_set(name, is_spot, count, vms.get(name, []), az.busy_set(busy))
        except AzureError as exc:
            raise pool_error(exc, pool=self.spec.name, action=f"scale VM scale sets to {n}") from None

    def _per_set(self, n: int, spot: int | None) -> dict[tuple[str, bool], int]:
        sets = build.scale_sets(self.spec)
        if len(sets) == 1:
            return {sets[0]: n}
        s = split(n, self.spec.spot_share)[0] if spot is None else min(max(int(spot), 0), n)
        return {sets[0]: n - s, sets[1]: s}

    def _scale_set(self, name: str, spot: bool, count: int, vms: list[Any], busy: set[str] | None) -> None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            current = int(self.client.virtual_machine_scale_sets.get(self.rg, name).sku.capacity or 0)
        except ResourceNotFoundError:
            if count == 0:
                return
            self.pollers.add(f"create scale set {name}", self.client.virtual_machine_scale_sets.begin_create_or_update(
                self.rg, name, build.scale_set(self.spec, spot, count)))
            log.info("vmss.created", pool=self.spec.name, scale_set=name, capacity=count)
            return
        if count > current:
            self.pollers.add(f"raise {name} to {count}", self.client.virtual_machine_scale_sets.begin_update(
                self.rg, name, build.capacity_update(self.spec, count)))
        elif count < current:
            victims = self._victims(vms, current - count, busy)
            if victims:
                self.pollers.add(f"delete idle instances of {name}",
                                 self.client.virtual_machine_scale_sets.begin_delete_instances(
                                     self.rg, name, build.delete_instances(victims)))

    def _victims(self, vms: list[Any], k: int, busy: set[str] | None) -> list[str]:
        ranked = []
        for vm in vms:
            state = self._state(vm, busy)
            if state in _REMOVAL_ORDER:
                ranked.append((_REMOVAL_ORDER[state], str(vm.instance_id)))
        return [iid for _, iid in sorted(ranked)[:k]]

    def _state(self, vm: Any, busy: set[str] | None) -> NodeState:
        state = self.node_state(build.vm_state(vm))
        if state is NodeState.IDLE and (busy is None or vm.name in busy):
            return NodeState.RUNNING  # unknown or busy: never a scale-in victim
        return state

    removes_by_id = True

    def remove(self, node_ids, *, dead: bool = False) -> None:
        """Delete the VMs named in ``node_ids`` (those still listed) by instance id; raises PoolError."""
        from azure.core.exceptions import AzureError

        wanted = set(node_ids)
        try:
            for name, vms in self._vms().items():
                victims = sorted(str(vm.instance_id) for vm in vms if vm.name in wanted)
                if victims:
                    why = "dead" if dead else "drained"
                    self.pollers.add(f"delete {why} instances of {name}",
                                     self.client.virtual_machine_scale_sets.begin_delete_instances(
                                         self.rg, name, build.delete_instances(victims)))
                    log.info("vmss.instances_removed", pool=self.spec.name, scale_set=name, instances=victims,
                             dead=dead)
        except AzureError as exc:
            raise pool_error(exc, pool=self.spec.name, action="delete VM scale set instances by id") from None

    def _vms(self) -> dict[str, list[Any]]:
        from azure.core.exceptions import ResourceNotFoundError

        out: dict[str, list[Any]] = {}
        for name, _ in build.scale_sets(self.spec):
            try:
                out[name] = list(self.client.virtual_machine_scale_set_vms.list(self.rg, name, expand="instanceView"))
            except ResourceNotFoundError:
                out[name] = []
        return out

    def status(self, *, busy: Busy = None) -> PoolStatus:
        from azure.core.exceptions import AzureError, ResourceNotFoundError

        busy = az.busy_set(busy)
        nodes: dict[str, NodeState] = {}
        target = spot = dedicated = 0
        try:
            vms = self._vms()
            for name, is_spot in build.scale_sets(self.spec):
                try:
                    target += int(self.client.virtual_machine_scale_sets.get(self.rg, name).sku.capacity or 0)
                except ResourceNotFoundError:
                    continue
                for vm in vms.get(name, []):
                    state = self._state(vm, busy)
                    nodes[str(vm.name)] = state
                    if state in _ALIVE:
                        spot += is_spot
                        dedicated += not is_spot
        except AzureError as exc:
            raise pool_error(exc, pool=self.spec.name, action="read VM scale sets") from None
        error = self.pollers.check()
        return PoolStatus(self.spec.name, target=target, nodes=nodes, spot=spot, dedicated=dedicated,
                          message=str(error) if error else "")

    def quota(self) -> dict[str, int | str | None]:
        """Free vCPUs: {"family", "cores", "spot_cores"} from the region's usage (None if not listed).

        The autoscaler puts these into Observation.quota_cores and spot_quota_nodes."""
        from azure.core.exceptions import AzureError

        family = str(self.spec.options.get("quota_family") or "")
        try:
            usages = list(self.client.usage.list(str(az.opt(self.spec, "location"))))
        except AzureError as exc:
            raise pool_error(exc, pool=self.spec.name, action="read compute quota") from None
        return {"family": family, "cores": build.quota_free(usages, family) if family else None,
                "spot_cores": build.quota_free(usages, "lowPriorityCores")}

