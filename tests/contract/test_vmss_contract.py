"""Contract tests for the VMSS backend: the real azure-mgmt-compute ComputeManagementClient
against the recording server on 127.0.0.1 (ARM paths, bodies, LROs, throttling, quota)."""

from __future__ import annotations

import base64

import pytest
from azure.core.exceptions import HttpResponseError

from tests.contract.busy import with_busy
from upwell.cost.tags import expires
from upwell.errors import PoolError, PoolErrorKind
from upwell.pools import make_pool
from upwell.pools.base import NodeState, PoolSpec

SETS = r"/subscriptions/s1/resourceGroups/rg/providers/Microsoft\.Compute/virtualMachineScaleSets"
IDENTITY = "/subscriptions/s1/resourceGroups/rg/providers/Microsoft.ManagedIdentity/userAssignedIdentities/worker"
QUOTA_MSG = ("Operation could not be completed as it results in exceeding approved standardNCSv3Family Cores quota. "
             "Additional details - Deployment Model: Resource Manager, Location: eastus, Current Limit: 0, "
             "Current Usage: 0, Additional Required: 24, (Minimum) New Limit Required: 24.")


def R(status=200, body=None, headers=None):  # a reply, as the server takes it
    return status, body, headers or {}


def A(code, message, status=400, headers=None):  # ARM's error envelope
    return status, {"error": {"code": code, "message": message}}, headers or {}


def spec(name="cpu", share=0.0, **options) -> PoolSpec:
    return PoolSpec(name, backend="vmss", vm_size="Standard_D4s_v5", max_nodes=10, spot_share=share,
                    options={"subscription_id": "s1", "resource_group": "rg", "location": "eastus",
                             "image": "upwellacr.azurecr.io/upwell-worker:1", "identity_id": IDENTITY,
                             "identity_client_id": "cid-123", "storage_account": "upwellstore",
                             "subnet_id": "/subscriptions/s1/.../subnets/workers", "ssh_public_key": "ssh-rsa AAAA",
                             "tags": {"project": "lab"}, "quota_family": "standardDSv5Family", **options})


def vmss_json(name, capacity):
    return {"name": name, "location": "eastus", "sku": {"name": "Standard_D4s_v5", "capacity": capacity},
            "properties": {"provisioningState": "Succeeded"}}


def vm(name, iid, power="running", prov="Succeeded"):
    return {"name": f"{name}_{iid}", "instanceId": str(iid),
            "properties": {"provisioningState": prov, "instanceView": {"statuses": [
                {"code": f"ProvisioningState/{prov.lower()}"}, {"code": f"PowerState/{power}"}]}}}


def make(server, credential, client_kwargs, s=None, busy=()):
    """A pool whose every scale_to and status call passes ``busy``, as the Autoscaler does."""
    return with_busy(make_pool(s or spec(), credential=credential, client_kwargs=client_kwargs), busy)


def wait(pool):
    """Let the pool's background LROs finish (wait() re-raises a failed one; status() reports it)."""
    for p in pool.pollers:
        try:
            p.wait(timeout=10)
        except HttpResponseError:
            pass


def test_contract_vmss_creates_regular_and_spot_sets(server, credential, client_kwargs):
    for name in ("upwell-cpu", "upwell-cpu-spot"):
        server.route("GET", rf"{SETS}/{name}", A("ResourceNotFound", f"{name} not found", 404),
                     R(200, vmss_json(name, 2)))  # the LRO's final GET
        server.route("GET", rf"{SETS}/{name}/virtualMachines", R(200, {"value": []}))
        server.route("PUT", rf"{SETS}/{name}", R(201, {**vmss_json(name, 0), "properties": {
            "provisioningState": "Creating"}}, {"Azure-AsyncOperation": f"{{base}}/ops/{name}"}))
        server.route("GET", rf"/ops/{name}", R(200, {"status": "InProgress"}, {"Retry-After": "0"}),
                     R(200, {"status": "Succeeded"}))
    pool = make(server, credential, client_kwargs, spec(share=0.5))
    pool.scale_to(4)
    for p in pool.pollers:
        p.result(timeout=10)

    regular, spot = (server.calls("PUT", rf"{SETS}/{n}")[0] for n in ("upwell-cpu", "upwell-cpu-spot"))
    assert regular.headers["Authorization"] == "Bearer fake-token" and regular.q("api-version")
    assert regular.body["sku"] == {"name": "Standard_D4s_v5", "tier": "Standard", "capacity": 2}
    assert spot.body["sku"]["capacity"] == 2
    assert regular.body["identity"] == {"type": "UserAssigned", "userAssignedIdentities": {IDENTITY: {}}}
    assert regular.body["tags"] == {"upwell-pool": "cpu", "upwell-backend": "vmss", "project": "lab",
                                    "upwell-project": "lab", "upwell-owner": "upwell", "upwell-expires": expires(30)}
    profile = spot.body["properties"]["virtualMachineProfile"]
    assert profile["priority"] == "Spot" and profile["evictionPolicy"] == "Delete"
    assert profile["billingProfile"] == {"maxPrice": -1}
    assert "evictionPolicy" not in regular.body["properties"]["virtualMachineProfile"]
    assert regular.body["properties"]["virtualMachineProfile"]["priority"] == "Regular"
    assert regular.body["properties"]["overprovision"] is False
    init = base64.b64decode(profile["osProfile"]["customData"]).decode()
    assert init.startswith("#cloud-config")
    assert "upwellacr.azurecr.io/upwell-worker:1 python -m workers.agent --pool cpu" in init
    assert "UPWELL_NODE_SPOT=1" in init and "AzureWebJobsStorage__clientId=cid-123" in init
    assert profile["scheduledEventsProfile"]["terminateNotificationProfile"]["enable"] is True
    assert len(server.calls("GET", r"/ops/upwell-cpu")) == 2  # LRO polled until Succeeded


def test_contract_vmss_scale_up_patches_capacity(server, credential, client_kwargs):
    server.route("GET", rf"{SETS}/upwell-cpu", R(200, vmss_json("upwell-cpu", 2)))
    server.route("GET", rf"{SETS}/upwell-cpu/virtualMachines", R(200, {"value": []}))
    server.route("PATCH", rf"{SETS}/upwell-cpu", R(200, vmss_json("upwell-cpu", 2), {
        "Azure-AsyncOperation": "{base}/ops/p", "Retry-After": "0"}))
    server.route("GET", r"/ops/p", R(200, {"status": "Succeeded"}))
    pool = make(server, credential, client_kwargs)
    pool.scale_to(5)
    wait(pool)
    patch = server.calls("PATCH", rf"{SETS}/upwell-cpu")
    assert len(patch) == 1 and patch[0].body == {"sku": {"name": "Standard_D4s_v5", "tier": "Standard",
                                                         "capacity": 5}}
    assert pool.status().message == ""


def test_contract_vmss_scale_in_deletes_only_idle_instances(server, credential, client_kwargs):
    server.route("GET", rf"{SETS}/upwell-cpu", R(200, vmss_json("upwell-cpu", 4)))
    server.route("GET", rf"{SETS}/upwell-cpu/virtualMachines", R(200, {"value": [
        vm("upwell-cpu", 0), vm("upwell-cpu", 1), vm("upwell-cpu", 2, power="starting", prov="Creating"),
        vm("upwell-cpu", 3)]}))
    server.route("POST", rf"{SETS}/upwell-cpu/delete", R(202, None, {"Location": "{base}/ops/d",
                                                                      "Retry-After": "0"}))
    server.route("GET", r"/ops/d", R(200))
    pool = make(server, credential, client_kwargs, busy={"upwell-cpu_0", "upwell-cpu_3"})
    pool.scale_to(1)
    wait(pool)
    deleted = server.calls("POST", rf"{SETS}/upwell-cpu/delete")
    assert len(deleted) == 1 and deleted[0].body == {"instanceIds": ["2", "1"]}  # booting, then idle
    assert not server.calls("PATCH", ".*")  # capacity is never lowered for Azure to pick victims


def test_contract_vmss_without_busy_source_removes_no_booted_vm(server, credential, client_kwargs):
    server.route("GET", rf"{SETS}/upwell-cpu", R(200, vmss_json("upwell-cpu", 2)))
    server.route("GET", rf"{SETS}/upwell-cpu/virtualMachines", R(200, {"value": [
        vm("upwell-cpu", 0), vm("upwell-cpu", 1, prov="Failed", power="stopped")]}))
    server.route("POST", rf"{SETS}/upwell-cpu/delete", R(200))
    pool = make_pool(spec(), credential=credential, client_kwargs=client_kwargs)
    assert pool.status().nodes == {"upwell-cpu_0": NodeState.RUNNING, "upwell-cpu_1": NodeState.FAILED}
    pool.scale_to(0)
    wait(pool)
    assert server.calls("POST", rf"{SETS}/upwell-cpu/delete")[0].body == {"instanceIds": ["1"]}


def test_contract_vmss_status(server, credential, client_kwargs):
    for name, cap in (("upwell-cpu", 2), ("upwell-cpu-spot", 2)):
        server.route("GET", rf"{SETS}/{name}", R(200, vmss_json(name, cap)))
    server.route("GET", rf"{SETS}/upwell-cpu/virtualMachines", R(200, {"value": [
        vm("upwell-cpu", 0), vm("upwell-cpu", 1, power="starting")]}))
    server.route("GET", rf"{SETS}/upwell-cpu-spot/virtualMachines", R(200, {"value": [
        vm("upwell-cpu-spot", 0), vm("upwell-cpu-spot", 5, prov="Deleting")]}))
    status = make(server, credential, client_kwargs, spec(share=0.5), busy={"upwell-cpu-spot_0"}).status()
    assert status.target == 4
    assert status.nodes == {"upwell-cpu_0": NodeState.IDLE, "upwell-cpu_1": NodeState.PENDING,
                            "upwell-cpu-spot_0": NodeState.RUNNING, "upwell-cpu-spot_5": NodeState.STOPPING}
    assert (status.dedicated, status.spot) == (2, 1)
    assert server.calls("GET", rf"{SETS}/upwell-cpu/virtualMachines")[0].q("$expand") == "instanceView"


def test_contract_vmss_quota_error(server, credential, client_kwargs):
    server.route("GET", rf"{SETS}/upwell-gpu", A("ResourceNotFound", "not found", 404))
    server.route("GET", rf"{SETS}/upwell-gpu/virtualMachines", A("ResourceNotFound", "not found", 404))
    server.route("PUT", rf"{SETS}/upwell-gpu", A("OperationNotAllowed", QUOTA_MSG, 409))
    pool = make(server, credential, client_kwargs, spec(name="gpu"))
    with pytest.raises(PoolError) as err:
        pool.scale_to(4)
    e = err.value
    assert e.kind is PoolErrorKind.QUOTA and e.permanent
    assert str(e).startswith("pool gpu needs 24 more cores of standardNCSv3Family quota (0 of 0 in use)")
    assert "OperationNotAllowed" in str(e) and e.__suppress_context__


def test_contract_vmss_retries_throttling(server, credential, client_kwargs):
    server.route("GET", rf"{SETS}/upwell-cpu",
                 A("TooManyRequests", "slow down", 429, {"Retry-After": "0"}),
                 A("TooManyRequests", "slow down", 429, {"Retry-After": "0"}), R(200, vmss_json("upwell-cpu", 3)))
    server.route("GET", rf"{SETS}/upwell-cpu/virtualMachines", R(200, {"value": []}))
    make(server, credential, client_kwargs).scale_to(3)  # at capacity: no change
    assert len(server.calls("GET", rf"{SETS}/upwell-cpu")) == 3
    assert not server.calls("PATCH", ".*")


def test_contract_vmss_throttled_to_the_end(server, credential, client_kwargs):
    server.route("GET", rf"{SETS}/upwell-cpu/virtualMachines",
                 A("TooManyRequests", "Rate limit for read operations exceeded", 429, {"Retry-After": "0.02"}))
    pool = make(server, credential, {**client_kwargs, "retry_total": 3})
    with pytest.raises(PoolError) as err:
        pool.status()
    assert err.value.kind is PoolErrorKind.THROTTLED and err.value.retry_after == pytest.approx(0.02)
    assert len(server.calls("GET", rf"{SETS}/upwell-cpu/virtualMachines")) == 4


def test_contract_vmss_allocation_failure_in_lro_shows_on_status(server, credential, client_kwargs):
    server.route("GET", rf"{SETS}/upwell-cpu", R(200, vmss_json("upwell-cpu", 0)))
    server.route("GET", rf"{SETS}/upwell-cpu/virtualMachines", R(200, {"value": []}))
    server.route("PATCH", rf"{SETS}/upwell-cpu", R(200, vmss_json("upwell-cpu", 0), {
        "Azure-AsyncOperation": "{base}/ops/a", "Retry-After": "0"}))
    server.route("GET", r"/ops/a", R(200, {"status": "InProgress"}, {"Retry-After": "0"}), R(200, {
        "status": "Failed", "error": {"code": "AllocationFailed",
                                      "message": "Allocation failed. We do not have sufficient capacity."}}))
    pool = make(server, credential, client_kwargs)
    pool.scale_to(3)
    wait(pool)
    message = pool.status().message
    assert "AllocationFailed" in message and "capacity" in message
    assert pool.pollers.error.kind is PoolErrorKind.CAPACITY


def test_contract_vmss_quota_from_usages(server, credential, client_kwargs):
    server.route("GET", r"/subscriptions/s1/providers/Microsoft\.Compute/locations/eastus/usages", R(200, {"value": [
        {"unit": "Count", "currentValue": 8, "limit": 20, "name": {"value": "standardDSv5Family"}},
        {"unit": "Count", "currentValue": 0, "limit": 0, "name": {"value": "lowPriorityCores"}}]}))
    assert make(server, credential, client_kwargs).quota() == {"family": "standardDSv5Family", "cores": 12,
                                                              "spot_cores": 0}
