"""Unit tests for the pure request builders, the SDK error adapter and the pool registry."""

from __future__ import annotations

import base64
import json
import sys
from types import SimpleNamespace

import pytest
import yaml
from azure.core.exceptions import ClientAuthenticationError, HttpResponseError

from upwell.cost.tags import expires
from upwell.errors import ConfigError, PoolError, PoolErrorKind
from upwell.pools import POOLS, backend_class, build_aci, build_batch, build_vmss, make_pool
from upwell.pools.azure_errors import classify, describe_resize_errors, pool_error, quota_detail
from upwell.pools.base import PoolSpec

IDENTITY = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ManagedIdentity/userAssignedIdentities/w"
BASE = {"image": "lab.azurecr.io/upwell-worker:2", "identity_id": IDENTITY, "identity_client_id": "cid",
        "storage_account": "acct", "subscription_id": "s", "resource_group": "rg", "account_name": "ba",
        "location": "eastus", "subnet_id": "/sub/net", "ssh_public_key": "ssh-ed25519 AAAA"}


def spec(name="cpu", backend="batch", share=0.0, **options) -> PoolSpec:
    return PoolSpec(name, backend=backend, vm_size="Standard_D4s_v5", tasks_per_node=2, spot_share=share,
                    options={**BASE, **options})


# --- registry ------------------------------------------------------------------------

def test_pools_registry_is_a_plain_dict_resolved_lazily():
    assert set(POOLS) == {"local", "batch", "vmss", "aci", "slurm"}
    assert all(":" in v for v in POOLS.values())
    assert backend_class("vmss").__name__ == "VmssPool"
    with pytest.raises(ConfigError, match="not known"):
        make_pool(PoolSpec("x", backend="pbs"))


def test_importing_pools_does_not_import_azure_sdks():
    code = ("import sys, upwell.pools; "
            "print(any(m.startswith(('azure.batch', 'azure.mgmt.compute', 'azure.mgmt.containerinstance')) "
            "for m in sys.modules))")
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_make_pool_passes_only_context():
    pool = make_pool(spec(backend="aci"), credential=object(), state_dir="/unused", client_kwargs={"retry_total": 1})
    assert type(pool).__name__ == "AciPool" and pool._kwargs == {"retry_total": 1}


def test_missing_option_names_the_setting():
    pool = make_pool(PoolSpec("gpu", backend="vmss", options={}), credential=object())
    with pytest.raises(ConfigError, match=r"UPWELL_POOLS\.gpu\.options\.subscription_id"):
        _ = pool.client


# --- batch ---------------------------------------------------------------------------

def test_batch_pool_body():
    body = build_batch.pool_body(spec())
    props = body["properties"]
    assert body["identity"]["userAssignedIdentities"] == {IDENTITY: {}}
    assert props["taskSlotsPerNode"] == 2 and props["interNodeCommunication"] == "Disabled"
    assert props["networkConfiguration"] == {"subnetId": "/sub/net"}
    assert props["scaleSettings"]["fixedScale"] == {
        "targetDedicatedNodes": 0, "targetLowPriorityNodes": 0, "resizeTimeout": "PT15M",
        "nodeDeallocationOption": "TaskCompletion"}
    start = props["startTask"]
    assert start["commandLine"].endswith("exec python -m workers.agent --pool cpu'")
    assert "AZ_BATCH_NODE_IS_DEDICATED" in start["commandLine"]
    assert start["containerSettings"]["containerRunOptions"] == "--rm --network host"
    assert start["userIdentity"] == {"userName": "upwell"}
    assert props["userAccounts"][0]["linuxUserConfiguration"] == {"uid": 10001, "gid": 10001}
    assert build_batch.pool_path(spec()).endswith("/batchAccounts/ba/pools/upwell-cpu")
    derived = spec(account_name="", account_url="https://labbatch.eastus.batch.azure.com")
    assert build_batch.pool_path(derived).endswith("/batchAccounts/labbatch/pools/upwell-cpu")
    with pytest.raises(ConfigError, match="account_name"):
        build_batch.pool_path(spec(account_name="", account_url="http://127.0.0.1:1"))


def test_batch_mpi_gpu_and_no_identity():
    mpi = build_batch.pool_body(spec("mpi"))["properties"]
    assert mpi["interNodeCommunication"] == "Enabled" and mpi["taskSlotsPerNode"] == 1
    gpu = build_batch.pool_body(spec("gpu", gpu=True, container_run_options="--rm --gpus all --ipc host"))
    assert gpu["properties"]["startTask"]["containerSettings"]["containerRunOptions"] == "--rm --ipc host"
    bare = build_batch.pool_body(spec(identity_id="", image="worker:local"))
    assert "identity" not in bare
    assert "containerRegistries" not in bare["properties"]["deploymentConfiguration"][
        "virtualMachineConfiguration"]["containerConfiguration"]


def test_batch_resize_and_remove_options():
    r = build_batch.resize_options(spec(), 3, 2).as_dict()
    assert r == {"targetDedicatedNodes": 3, "targetLowPriorityNodes": 2,
                 "resizeTimeout": "PT15M00S", "nodeDeallocationOption": "taskcompletion"}
    assert build_batch.remove_options(spec(), ["a", "b"]).as_dict()["nodeList"] == ["a", "b"]
    with pytest.raises(ValueError):
        build_batch.remove_options(spec(), [])
    with pytest.raises(ValueError):
        build_batch.remove_options(spec(), [str(i) for i in range(101)])


# --- vmss ----------------------------------------------------------------------------

@pytest.mark.parametrize("share, expected", [(0.0, [("upwell-cpu", False)]), (1.0, [("upwell-cpu-spot", True)]),
                                             (0.3, [("upwell-cpu", False), ("upwell-cpu-spot", True)])])
def test_vmss_scale_sets_follow_spot_share(share, expected):
    assert build_vmss.scale_sets(spec(backend="vmss", share=share)) == expected


def test_vmss_cloud_init_is_valid_yaml_that_runs_the_agent():
    text = build_vmss.cloud_init(spec(backend="vmss", gpu=True), spot=True)
    doc = yaml.safe_load(text)
    files = {f["path"]: f for f in doc["write_files"]}
    env = files["/etc/upwell/agent.env"]["content"]
    assert "AzureWebJobsStorage__accountName=acct\n" in env and files["/etc/upwell/agent.env"]["permissions"] == "0600"
    agent = files["/usr/local/bin/upwell-agent"]["content"]
    assert "--gpus all" in agent and "UPWELL_NODE_SPOT=1" in agent
    assert "lab.azurecr.io/oauth2/exchange" in agent and "client_id=cid" in agent
    assert agent.rstrip().endswith("lab.azurecr.io/upwell-worker:2 python -m workers.agent --pool cpu")
    # the agent watches Scheduled Events for its own VM (workers.eviction); no shell watcher stops it for any VM's
    assert "UPWELL_EVICTION_WATCH=1\n" in env and "/usr/local/bin/upwell-evict-watch" not in files
    assert ["systemctl", "enable", "--now", "upwell-agent.service"] in doc["runcmd"]
    assert base64.b64decode(build_vmss.custom_data(spec(backend="vmss"), False)).decode().startswith("#cloud-config")


def test_vmss_model_regular_and_spot():
    regular = build_vmss.as_json(build_vmss.scale_set(spec(backend="vmss"), spot=False, capacity=2))
    spot = build_vmss.as_json(build_vmss.scale_set(spec(backend="vmss"), spot=True))
    prof = spot["properties"]["virtualMachineProfile"]
    assert (prof["priority"], prof["evictionPolicy"], prof["billingProfile"]) == ("Spot", "Delete", {"maxPrice": -1})
    rprof = regular["properties"]["virtualMachineProfile"]
    assert rprof["priority"] == "Regular" and "billingProfile" not in rprof
    assert regular["sku"]["capacity"] == 2 and regular["properties"]["upgradePolicy"] == {"mode": "Manual"}
    nic = rprof["networkProfile"]["networkInterfaceConfigurations"][0]
    assert nic["properties"]["ipConfigurations"][0]["properties"]["subnet"] == {"id": "/sub/net"}
    assert rprof["osProfile"]["linuxConfiguration"]["disablePasswordAuthentication"] is True
    assert build_vmss.as_json(build_vmss.capacity_update(spec(backend="vmss"), 7)) == {
        "sku": {"name": "Standard_D4s_v5", "tier": "Standard", "capacity": 7}}


@pytest.mark.parametrize("prov, codes, expected", [
    ("Creating", [], "creating"), ("Deleting", ["PowerState/running"], "deleting"),
    ("Succeeded", ["ProvisioningState/succeeded", "PowerState/running"], "running"),
    ("Succeeded", ["PowerState/deallocated"], "deallocated"), ("Updating", [], "creating"),
    ("Succeeded", [], "unknown"), ("Failed", ["PowerState/running"], "failed"),
])
def test_vmss_vm_state(prov, codes, expected):
    vm = SimpleNamespace(provisioning_state=prov,
                         instance_view=SimpleNamespace(statuses=[SimpleNamespace(code=c) for c in codes]))
    assert build_vmss.vm_state(vm) == expected


def test_vmss_quota_free():
    rows = [SimpleNamespace(name=SimpleNamespace(value="standardNCSv3Family"), limit=24, current_value=18)]
    assert build_vmss.quota_free(rows, "standardncsv3family") == 6 and build_vmss.quota_free(rows, "x") is None


# --- aci -----------------------------------------------------------------------------

def test_aci_group_body():
    g = build_aci.container_group(spec("gpu", backend="aci", gpu_count=2, gpu_sku="p100", tags={"lab": "x"}),
                                  "upwell-gpu-0a1b2c3d", spot=True)
    body = json.loads(json.dumps(g.serialize()))
    props = body["properties"]
    assert props["restartPolicy"] == "Never" and props["priority"] == "Regular"  # no spot with GPUs
    assert props["containers"][0]["properties"]["resources"]["requests"]["gpu"] == {"count": 2, "sku": "P100"}
    assert body["tags"] == {"upwell-pool": "gpu", "upwell-backend": "aci", "lab": "x", "upwell-project": "upwell",
                            "upwell-owner": "upwell", "upwell-expires": expires(30)}
    assert props["subnetIds"] == [{"id": "/sub/net"}]
    cpu = build_aci.container_group(spec("cpu", backend="aci"), "n", spot=True).serialize()
    assert cpu["properties"]["priority"] == "Spot" and "gpu" not in cpu["properties"]["containers"][0][
        "properties"]["resources"]["requests"]
    with pytest.raises(ConfigError, match="gpu_sku"):
        build_aci.container_group(spec(backend="aci", gpu_count=1, gpu_sku="A100"), "n")


def test_aci_warm_group_keeps_its_agent_and_is_tagged():
    """Issue 25 item 15: a warm group (one of the first min_nodes) runs its agent with the warm idle exit
    (default 0: never) and carries upwell-warm; the others keep idle_exit_s."""
    def agent(group):
        props = group.serialize()["properties"]["containers"][0]["properties"]
        env = {e["name"]: e["value"] for e in props["environmentVariables"]}
        return props["command"][props["command"].index("--idle-exit") + 1], env["UPWELL_IDLE_EXIT_S"]

    warm = build_aci.container_group(spec(backend="aci"), "n", warm=True)
    assert agent(warm) == ("0", "0") and warm.tags[build_aci.WARM_TAG] == "1"
    cold = build_aci.container_group(spec(backend="aci"), "n")
    assert agent(cold) == ("300", "300") and build_aci.WARM_TAG not in cold.tags
    assert agent(build_aci.container_group(spec(backend="aci", warm_idle_exit_s=1800), "n", warm=True)) == (
        "1800", "1800")


def test_aci_group_names():
    name = build_aci.group_name(PoolSpec("GPU_big" * 10))
    assert len(name) <= 63 and name == name.lower() and "_" not in name
    assert build_aci.group_name(PoolSpec("cpu"), "abc") == "upwell-cpu-abc"


@pytest.mark.parametrize("prov, state, expected", [
    ("Creating", None, "creating"), ("Succeeded", "Running", "running"), ("Succeeded", "Succeeded", "succeeded"),
    ("Failed", "Running", "failed"), ("Succeeded", None, "unknown"), ("Pending", None, "pending"),
])
def test_aci_group_state(prov, state, expected):
    g = SimpleNamespace(provisioning_state=prov, instance_view=SimpleNamespace(state=state) if state else None)
    assert build_aci.group_state(g) == expected


# --- errors --------------------------------------------------------------------------

class _Response:
    def __init__(self, status, body, headers=None):
        self.status_code = status
        self.headers = headers or {}
        self.reason = "x"
        self._body = json.dumps(body).encode()
        self.content_type = "application/json"

    def text(self, encoding=None):
        return self._body.decode()

    def body(self):
        return self._body


def http_error(status, code, message, headers=None, cls=HttpResponseError):
    return cls(response=_Response(status, {"error": {"code": code, "message": message}}, headers))


@pytest.mark.parametrize("status, code, text, kind", [
    (409, "OperationNotAllowed", "exceeding approved standardNCSv3Family Cores quota", PoolErrorKind.QUOTA),
    (409, "OperationNotAllowed", "the VM is being deleted", PoolErrorKind.OTHER),
    (409, "QuotaExceeded", "", PoolErrorKind.QUOTA),
    (None, "AccountCoreQuotaReached", "", PoolErrorKind.QUOTA),
    (409, "PoolQuotaReached", "", PoolErrorKind.QUOTA),
    (409, "SkuNotAvailable", "", PoolErrorKind.CAPACITY),
    (200, "ZonalAllocationFailed", "", PoolErrorKind.CAPACITY),
    (200, "AllocationFailed", "", PoolErrorKind.CAPACITY),
    (403, "AuthorizationFailed", "", PoolErrorKind.AUTH),
    (401, "", "", PoolErrorKind.AUTH),
    (429, "", "", PoolErrorKind.THROTTLED),
    (503, "ServerBusy", "", PoolErrorKind.THROTTLED),
    (404, "ResourceNotFound", "", PoolErrorKind.NOT_FOUND),
    (500, "InternalError", "", PoolErrorKind.OTHER),
])
def test_classify(status, code, text, kind):
    assert classify(status, code, text) is kind


def test_translate_http_errors():
    msg = ("Operation could not be completed as it results in exceeding approved standardNCSv3Family Cores quota. "
           "Additional details - Deployment Model: Resource Manager, Location: eastus, Current Limit: 12, "
           "Current Usage: 12, Additional Required: 24, (Minimum) New Limit Required: 36.")
    e = pool_error(http_error(409, "OperationNotAllowed", msg), pool="gpu", action="create scale set")
    assert isinstance(e, PoolError) and e.kind is PoolErrorKind.QUOTA and e.permanent
    assert str(e).startswith("pool gpu needs 24 more cores of standardNCSv3Family quota (12 of 12 in use)")
    t = pool_error(http_error(429, "TooManyRequests", "slow", {"Retry-After": "17"}), pool="cpu", action="list")
    assert t.kind is PoolErrorKind.THROTTLED and t.retry_after == 17 and not t.permanent
    a = pool_error(http_error(401, "InvalidAuthenticationToken", "bad", cls=ClientAuthenticationError),
                  pool="cpu", action="list")
    assert a.kind is PoolErrorKind.AUTH and "role" in str(a)
    assert pool_error(e, pool="x", action="y") is e
    assert quota_detail("nothing") is None


def test_describe_resize_errors():
    kind, msg = describe_resize_errors("cpu", [
        SimpleNamespace(code="AllocationTimedout", message="took too long"),
        SimpleNamespace(code="AccountLowPriorityCoreQuotaReached", message="spot cores used up")])
    assert kind is PoolErrorKind.QUOTA and "AccountLowPriorityCoreQuotaReached" in msg and "pool cpu" in msg
    assert describe_resize_errors("cpu", []) == (None, "")
