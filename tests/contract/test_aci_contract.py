"""Contract tests for the ACI backend: the real azure-mgmt-containerinstance client against
the recording server on 127.0.0.1 (group bodies, GPU sku, identity, tags, LROs, errors)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from azure.core.exceptions import HttpResponseError

from tests.contract.busy import with_busy
from upwell.cost.tags import expires
from upwell.errors import PoolError, PoolErrorKind
from upwell.pools import make_pool
from upwell.pools.base import NodeState, PoolSpec

GROUPS = r"/subscriptions/s1/resourceGroups/rg/providers/Microsoft\.ContainerInstance/containerGroups"
IDENTITY = "/subscriptions/s1/resourceGroups/rg/providers/Microsoft.ManagedIdentity/userAssignedIdentities/worker"


def R(status=200, body=None, headers=None):  # a reply, as the server takes it
    return status, body, headers or {}


def A(code, message, status=400, headers=None):  # ARM's error envelope
    return status, {"error": {"code": code, "message": message}}, headers or {}


def spec(name="gpu", share=0.0, **options) -> PoolSpec:
    return PoolSpec(name, backend="aci", vm_size="aci", max_nodes=10, spot_share=share,
                    options={"subscription_id": "s1", "resource_group": "rg", "location": "eastus",
                             "image": "upwellacr.azurecr.io/upwell-gpu:1", "identity_id": IDENTITY,
                             "identity_client_id": "cid-123", "storage_account": "upwellstore",
                             "cpu": 6, "memory_gb": 56, "tags": {"project": "lab"}, **options})


def group(name, state="Running", prov="Succeeded", pool="gpu", priority="Regular", view=True):
    props = {"provisioningState": prov, "priority": priority, "osType": "Linux", "containers": []}
    if view:
        props["instanceView"] = {"state": state}
    return {"name": name, "tags": {"upwell-pool": pool}, "location": "eastus", "properties": props}


def make(credential, client_kwargs, s=None, busy=None):
    """A pool whose every scale_to and status call passes ``busy`` (None: not known), as the Autoscaler does."""
    return with_busy(make_pool(s or spec(), credential=credential, client_kwargs=client_kwargs), busy)


def wait(pool):
    for p in pool.pollers:
        try:
            p.wait(timeout=10)
        except HttpResponseError:
            pass


def test_contract_aci_creates_gpu_groups_with_identity_and_tags(server, credential, client_kwargs):
    server.route("GET", GROUPS, R(200, {"value": [group("other-1", pool="cpu")]}))

    def created(rec, m):
        return 201, {**group(m[1], prov="Creating", view=False)}, {"Azure-AsyncOperation": f"{{base}}/ops/{m[1]}"}

    server.route("PUT", GROUPS + r"/([\w-]+)", created)
    server.route("GET", r"/ops/([\w-]+)", R(200, {"status": "Succeeded"}))
    server.route("GET", GROUPS + r"/([\w-]+)", lambda rec, m: (200, group(m[1]), {}))
    pool = make(credential, client_kwargs, spec(gpu_count=1, gpu_sku="V100"))
    pool.scale_to(2)
    for p in pool.pollers:
        p.result(timeout=10)

    puts = server.calls("PUT", GROUPS + r"/[\w-]+")
    assert len(puts) == 2
    names = [p.path.rsplit("/", 1)[1] for p in puts]
    assert all(n.startswith("upwell-gpu-") and len(n) <= 63 for n in names) and len(set(names)) == 2
    body = puts[0].body
    assert body["location"] == "eastus"
    assert body["tags"] == {"upwell-pool": "gpu", "upwell-backend": "aci", "project": "lab", "upwell-project": "lab",
                            "upwell-owner": "upwell", "upwell-expires": expires(30)}
    assert body["identity"] == {"type": "UserAssigned", "userAssignedIdentities": {IDENTITY: {}}}
    props = body["properties"]
    assert props["restartPolicy"] == "Never" and props["osType"] == "Linux" and props["priority"] == "Regular"
    assert props["imageRegistryCredentials"] == [{"server": "upwellacr.azurecr.io", "identity": IDENTITY}]
    c = props["containers"][0]
    assert c["properties"]["image"] == "upwellacr.azurecr.io/upwell-gpu:1"
    assert c["properties"]["command"] == ["python", "-m", "workers.agent", "--pool", "gpu", "--idle-exit", "300"]
    assert c["properties"]["resources"]["requests"] == {"memoryInGB": 56.0, "cpu": 6.0,
                                                        "gpu": {"count": 1, "sku": "V100"}}
    env = {e["name"]: e["value"] for e in c["properties"]["environmentVariables"]}
    assert env["UPWELL_NODE_ID"] == names[0] and env["AZURE_CLIENT_ID"] == "cid-123"
    assert env["AzureWebJobsStorage__accountName"] == "upwellstore"
    assert puts[0].headers["Authorization"] == "Bearer fake-token"


def test_contract_aci_spot_groups(server, credential, client_kwargs):
    server.route("GET", GROUPS, R(200, {"value": []}))
    server.route("PUT", GROUPS + r"/([\w-]+)", lambda rec, m: (200, group(m[1]), {}))
    pool = make(credential, client_kwargs, spec(name="cpu", share=0.5, cpu=1, memory_gb=2))
    pool.scale_to(4)
    wait(pool)
    priorities = sorted(p.body["properties"]["priority"] for p in server.calls("PUT", GROUPS + r"/[\w-]+"))
    assert priorities == ["Regular", "Regular", "Spot", "Spot"]


def test_contract_aci_keeps_min_nodes_warm(server, credential, client_kwargs):
    """Issue 25 item 15: with min_nodes 2 and one warm group alive, of two new groups one is warm (its agent
    never exits on idle, tagged upwell-warm); scale-in deletes the idle warm group last."""
    def agent_idle_exit(body):
        command = body["properties"]["containers"][0]["properties"]["command"]
        return command[command.index("--idle-exit") + 1]

    warm = group("upwell-cpu-a", pool="cpu")
    warm["tags"]["upwell-warm"] = "1"
    server.route("GET", GROUPS, R(200, {"value": [warm, group("upwell-cpu-b", pool="cpu")]}))
    server.route("PUT", GROUPS + r"/([\w-]+)", lambda rec, m: (200, group(m[1], pool="cpu"), {}))
    server.route("DELETE", GROUPS + r"/([\w-]+)", R(200, None, {"Location": "{base}/ops/del", "Retry-After": "0"}))
    server.route("GET", r"/ops/del", R(204))
    pool = make(credential, client_kwargs, replace(spec(name="cpu", cpu=1, memory_gb=2), min_nodes=2), busy=())
    pool.scale_to(4)
    wait(pool)
    bodies = [p.body for p in server.calls("PUT", GROUPS + r"/[\w-]+")]
    assert sorted((b["tags"].get("upwell-warm", "-"), agent_idle_exit(b)) for b in bodies) == [("-", "300"), ("1", "0")]
    pool.scale_to(1)  # a (warm) and b idle: b goes, a stays
    wait(pool)
    assert [c.path.rsplit("/", 1)[1] for c in server.calls("DELETE", GROUPS + r"/[\w-]+")] == ["upwell-cpu-b"]


def test_contract_aci_scale_in_deletes_finished_and_idle_groups_only(server, credential, client_kwargs):
    server.route("GET", GROUPS, R(200, {"value": [
        group("upwell-gpu-a"), group("upwell-gpu-b"), group("upwell-gpu-c", state="Succeeded"),
        group("upwell-gpu-d", prov="Creating", view=False), group("upwell-gpu-e", view=False)]}))
    server.route("GET", GROUPS + r"/upwell-gpu-e", R(200, group("upwell-gpu-e", state="Running")))
    server.route("DELETE", GROUPS + r"/([\w-]+)", R(200, None, {"Location": "{base}/ops/del", "Retry-After": "0"}))
    server.route("GET", r"/ops/del", R(204))
    pool = make(credential, client_kwargs, busy={"upwell-gpu-a", "upwell-gpu-e"})
    pool.scale_to(2)
    wait(pool)
    deleted = {c.path.rsplit("/", 1)[1] for c in server.calls("DELETE", GROUPS + r"/[\w-]+")}
    # c finished (restart Never); alive a, b, d, e -> 2: the booting d, then idle b. a and e run shards.
    assert deleted == {"upwell-gpu-c", "upwell-gpu-d", "upwell-gpu-b"}
    assert not server.calls("PUT", ".*")


def test_contract_aci_status(server, credential, client_kwargs):
    server.route("GET", GROUPS, R(200, {"value": [
        group("upwell-gpu-a"), group("upwell-gpu-b", priority="Spot"), group("upwell-gpu-c", state="Failed"),
        group("upwell-gpu-d", prov="Pending", view=False), group("x", pool="cpu")]}))
    status = make(credential, client_kwargs).status()  # no busy source: running groups count as busy
    assert status.nodes == {"upwell-gpu-a": NodeState.RUNNING, "upwell-gpu-b": NodeState.RUNNING,
                            "upwell-gpu-c": NodeState.FAILED, "upwell-gpu-d": NodeState.PENDING}
    assert (status.target, status.spot, status.dedicated) == (3, 1, 2)


def test_contract_aci_quota_error(server, credential, client_kwargs):
    server.route("GET", GROUPS, R(200, {"value": []}))
    server.route("PUT", GROUPS + r"/[\w-]+", A(
        "ContainerGroupQuotaReached", "Resource type 'Microsoft.ContainerInstance/containerGroups' container "
        "group quota 'StandardV100Cores' exceeded in region 'eastus'. Limit: '0', Usage: '0', Requested: '6'.", 409))
    with pytest.raises(PoolError) as err:
        make(credential, client_kwargs, spec(gpu_count=1)).scale_to(1)
    assert err.value.kind is PoolErrorKind.QUOTA and "StandardV100Cores" in str(err.value)


def test_contract_aci_throttling_and_capacity(server, credential, client_kwargs):
    server.route("GET", GROUPS, A("TooManyRequests", "throttled", 429, {"Retry-After": "0"}), R(200, {"value": []}))
    server.route("PUT", GROUPS + r"/([\w-]+)", lambda rec, m: (201, group(m[1], prov="Creating", view=False), {
        "Azure-AsyncOperation": "{base}/ops/x", "Retry-After": "0"}))
    server.route("GET", r"/ops/x", R(200, {"status": "Failed", "error": {
        "code": "ServiceUnavailable", "message": "The requested resource is not available in the location 'eastus'"
                                                 " at this moment. Please retry with a different resource request."}}))
    pool = make(credential, client_kwargs)
    pool.scale_to(1)
    assert len(server.calls("GET", GROUPS)) == 2  # the 429 was retried by the SDK
    wait(pool)
    server.route("GET", GROUPS, R(200, {"value": []}))
    message = pool.status().message
    assert "ServiceUnavailable" in message and pool.pollers.error.kind is PoolErrorKind.THROTTLED
