"""Contract tests for the Batch backend: the real azure-batch BatchClient (and an ARM
pipeline for pool creation) against the recording server on 127.0.0.1."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from azure.batch import models as m

from tests.contract.busy import with_busy
from upwell.errors import PoolError, PoolErrorKind
from upwell.pools import build_batch, make_pool
from upwell.pools.base import NodeState, PoolSpec


def R(status=200, body=None, headers=None):  # a reply, as the server takes it
    return status, body, headers or {}


def A(code, message, status=400, headers=None):  # ARM's error envelope
    return status, {"error": {"code": code, "message": message}}, headers or {}


def B(code, message, status=409, headers=None):  # Batch's data-plane error
    return status, {"code": code, "message": {"lang": "en-US", "value": message}}, headers or {}

REPO = Path(__file__).resolve().parents[2]
IDENTITY = "/subscriptions/s1/resourceGroups/rg/providers/Microsoft.ManagedIdentity/userAssignedIdentities/worker"
ARM_POOL = r"/subscriptions/s1/resourceGroups/rg/providers/Microsoft\.Batch/batchAccounts/acct/pools/upwell-(\w+)"


def spec(server, name="cpu", **options) -> PoolSpec:
    return PoolSpec(name, backend="batch", vm_size="Standard_D4s_v5", max_nodes=10, spot_share=0.5,
                    options={"account_url": server.url, "subscription_id": "s1", "resource_group": "rg",
                             "account_name": "acct", "image": "upwellacr.azurecr.io/upwell-worker:1",
                             "identity_id": IDENTITY, "identity_client_id": "cid-123",
                             "storage_account": "upwellstore", **options})


def pool_json(dedicated=0, spot=0, state="steady", errors=None):
    return {"id": "upwell-cpu", "allocationState": state, "targetDedicatedNodes": dedicated,
            "targetLowPriorityNodes": spot, "resizeErrors": errors or []}


def nodes_json(*nodes):
    return {"value": [{"id": i, "state": s, "isDedicated": d} for i, s, d in nodes]}


def make(server, credential, client_kwargs, busy=None, **options):
    """A pool whose every scale_to and status call passes ``busy``, as the Autoscaler does."""
    return with_busy(make_pool(spec(server, **options), credential=credential, client_kwargs=client_kwargs),
                     busy or ())


def test_contract_batch_creates_pool_through_arm_then_resizes(server, credential, client_kwargs):
    server.route("GET", r"/pools/upwell-cpu", R(404, {"code": "PoolNotFound", "message": {"value": "no"}}),
                 R(200, pool_json()))
    server.route("PUT", ARM_POOL, R(201, {"properties": {"provisioningState": "Creating"}},
                                        {"Azure-AsyncOperation": "{base}/ops/create-pool"}))
    server.route("GET", r"/ops/create-pool", R(200, {"status": "InProgress"}, {"Retry-After": "0"}),
                 R(200, {"status": "Succeeded"}))
    server.route("GET", ARM_POOL, R(200, {"id": "p", "properties": {"provisioningState": "Succeeded"}}))
    server.route("POST", r"/pools/upwell-cpu/resize", R(202))

    pool = make(server, credential, client_kwargs)
    pool.scale_to(4)
    pool.last_poller.result(timeout=10)

    put = server.calls("PUT", ARM_POOL)[0]
    assert put.q("api-version") == "2024-07-01"
    assert put.headers["Authorization"] == "Bearer fake-token"
    body = put.body
    assert body["identity"] == {"type": "UserAssigned", "userAssignedIdentities": {IDENTITY: {}}}
    props = body["properties"]
    assert props["vmSize"] == "Standard_D4s_v5"
    vm = props["deploymentConfiguration"]["virtualMachineConfiguration"]
    assert vm["containerConfiguration"] == {
        "type": "DockerCompatible", "containerImageNames": ["upwellacr.azurecr.io/upwell-worker:1"],
        "containerRegistries": [{"registryServer": "upwellacr.azurecr.io",
                                 "identityReference": {"resourceId": IDENTITY}}]}
    start = props["startTask"]
    assert "python -m workers.agent --pool cpu" in start["commandLine"]
    assert start["waitForSuccess"] is False
    assert start["containerSettings"]["imageName"] == "upwellacr.azurecr.io/upwell-worker:1"
    assert start["containerSettings"]["registry"]["identityReference"]["resourceId"] == IDENTITY
    env = {e["name"]: e["value"] for e in start["environmentSettings"]}
    assert env["AZURE_CLIENT_ID"] == "cid-123" and env["AzureWebJobsStorage__credential"] == "managedidentity"
    assert env["AzureWebJobsStorage__accountName"] == "upwellstore" and env["UPWELL_POOL"] == "cpu"
    assert props["scaleSettings"]["fixedScale"]["nodeDeallocationOption"] == "TaskCompletion"
    assert props["interNodeCommunication"] == "Disabled"
    assert len(server.calls("GET", r"/ops/create-pool")) == 2  # the LRO was polled to Succeeded

    resize = server.calls("POST", r"/pools/upwell-cpu/resize")
    assert len(resize) == 1
    assert resize[0].body == {"targetDedicatedNodes": 2, "targetLowPriorityNodes": 2, "resizeTimeout": "PT15M00S",
                              "nodeDeallocationOption": "taskcompletion"}
    assert resize[0].headers["Authorization"] == "Bearer fake-token"
    assert ("https://batch.core.windows.net//.default",) in credential.calls
    assert ("https://management.azure.com/.default",) in credential.calls


def test_contract_batch_explicit_spot_split_growth_first(server, credential, client_kwargs):
    server.route("GET", r"/pools/upwell-cpu", R(200, pool_json(dedicated=3, spot=1)))
    server.route("POST", r"/pools/upwell-cpu/resize", R(202))
    pool = make(server, credential, client_kwargs)
    pool.scale_to(4, spot=1)  # already there: nothing sent
    assert not server.calls("POST", ".*")
    pool.scale_to(6, spot=0)  # dedicated grows now; the spot node goes later, once idle
    body = server.calls("POST", r"/pools/upwell-cpu/resize")[0].body
    assert (body["targetDedicatedNodes"], body["targetLowPriorityNodes"]) == (6, 1)
    server.route("GET", r"/pools/upwell-cpu", R(200, pool_json(dedicated=6, spot=1)))
    server.route("GET", r"/pools/upwell-cpu/nodes", R(200, nodes_json(("s1", "running", False))))
    pool.scale_to(6, spot=0)
    assert not server.calls("POST", r"/pools/upwell-cpu/removenodes")  # the only spot node is busy


def test_contract_batch_scale_in_removes_only_idle_nodes(server, credential, client_kwargs):
    server.route("GET", r"/pools/upwell-cpu", R(200, pool_json(dedicated=4)))
    server.route("GET", r"/pools/upwell-cpu/nodes", R(200, nodes_json(
        ("n1", "running", True), ("n2", "idle", True), ("n3", "idle", True), ("n4", "starting", True))))
    server.route("POST", r"/pools/upwell-cpu/removenodes", R(202))
    pool = make(server, credential, client_kwargs, busy={"n2"})  # n2 runs a shard (the ledger says)
    pool.scale_to(1, spot=0)
    removed = server.calls("POST", r"/pools/upwell-cpu/removenodes")
    assert len(removed) == 1
    assert removed[0].body["nodeList"] == ["n4", "n3"]  # booting first, then idle; never n1 or n2
    assert removed[0].body["nodeDeallocationOption"] == "taskcompletion"
    assert not server.calls("POST", r"/pools/upwell-cpu/resize")


def test_contract_batch_defers_while_resizing(server, credential, client_kwargs):
    server.route("GET", r"/pools/upwell-cpu", R(200, pool_json(dedicated=2, state="resizing")))
    make(server, credential, client_kwargs).scale_to(8)
    assert not server.calls("POST", ".*")


def test_contract_batch_status_counts_and_resize_errors(server, credential, client_kwargs):
    errors = [{"code": "AccountCoreQuotaReached",
               "message": "The specified account has reached VM core quota for standardDSv5Family"}]
    server.route("GET", r"/pools/upwell-cpu", R(200, pool_json(dedicated=3, spot=2, errors=errors)))
    server.route("GET", r"/pools/upwell-cpu/nodes", R(200, nodes_json(
        ("a", "idle", True), ("b", "idle", True), ("c", "waitingforstarttask", True),
        ("d", "running", False), ("e", "preempted", False), ("f", "starttaskfailed", True))))
    status = make(server, credential, client_kwargs, busy={"b"}).status()
    assert status.target == 5
    assert status.nodes == {"a": NodeState.IDLE, "b": NodeState.RUNNING, "c": NodeState.PENDING,
                            "d": NodeState.RUNNING, "e": NodeState.PREEMPTED, "f": NodeState.FAILED}
    assert (status.dedicated, status.spot, status.preempted) == (3, 1, 1)
    assert status.alive == 4 and status.idle == 1
    assert "AccountCoreQuotaReached" in status.message and "quota" in status.message


def test_contract_batch_retries_throttling_then_succeeds(server, credential, client_kwargs):
    server.route("GET", r"/pools/upwell-cpu", R(200, pool_json()))
    server.route("POST", r"/pools/upwell-cpu/resize",
                 B("ServerBusy", "slow down", 429, {"Retry-After": "0"}),
                 B("ServerBusy", "slow down", 503, {"Retry-After": "0"}), R(202))
    pool = make(server, credential, client_kwargs)
    pool.scale_to(2, spot=0)
    pool.last_poller.result(timeout=10)
    assert len(server.calls("POST", r"/pools/upwell-cpu/resize")) == 3  # two retries by the SDK, then accepted


def test_contract_batch_throttling_that_persists_is_a_throttled_pool_error(server, credential, client_kwargs):
    server.route("GET", r"/pools/upwell-cpu", R(200, pool_json()))
    server.route("POST", r"/pools/upwell-cpu/resize",
                 B("ServerBusy", "the server is busy", 503, {"Retry-After": "0.01"}))
    pool = make(server, credential, {**client_kwargs, "retry_total": 2})
    with pytest.raises(PoolError) as err:
        pool.scale_to(2)
    assert err.value.kind is PoolErrorKind.THROTTLED and err.value.retry_after == pytest.approx(0.01)
    assert not err.value.permanent
    assert len(server.calls("POST", r"/pools/upwell-cpu/resize")) == 3  # 1 + retry_total


def test_contract_batch_pool_quota_is_a_quota_pool_error(server, credential, client_kwargs):
    server.route("GET", r"/pools/upwell-gpu", R(404, {"code": "PoolNotFound", "message": {"value": "no"}}))
    server.route("PUT", ARM_POOL, A("PoolQuotaReached", "The Batch account has reached its pool quota "
                                                                "of 20 pools.", 409))
    pool = make_pool(spec(server, name="gpu"), credential=credential, client_kwargs=client_kwargs)
    with pytest.raises(PoolError) as err:
        pool.scale_to(1)
    assert err.value.kind is PoolErrorKind.QUOTA and err.value.permanent
    assert "pool gpu" in str(err.value) and "PoolQuotaReached" in str(err.value)
    assert err.value.__cause__ is None and err.value.__suppress_context__


def test_contract_batch_auth_failure(server, credential, client_kwargs):
    server.route("GET", r"/pools/upwell-cpu", B("AuthenticationFailed", "Server failed to authenticate",
                                                          403))
    with pytest.raises(PoolError) as err:
        make(server, credential, client_kwargs).status()
    assert err.value.kind is PoolErrorKind.AUTH


def test_contract_batch_mpi_pool_has_inter_node_communication(server, credential, client_kwargs):
    """An MPI pool, created by scale_to through ARM: nodes talk to each other, one task slot a node."""
    server.route("GET", r"/pools/upwell-mpi", R(404, {"code": "PoolNotFound", "message": {"value": "no"}}),
                 R(200, {**pool_json(), "id": "upwell-mpi"}))
    server.route("PUT", ARM_POOL, R(200, {"properties": {"provisioningState": "Succeeded"}}))
    server.route("POST", r"/pools/upwell-mpi/resize", R(202))
    pool = make_pool(spec(server, name="mpi", mpi=True), credential=credential, client_kwargs=client_kwargs)
    pool.scale_to(2, spot=0)
    props = server.calls("PUT", ARM_POOL)[0].body["properties"]
    assert props["interNodeCommunication"] == "Enabled" and props["taskSlotsPerNode"] == 1
    resize = server.calls("POST", r"/pools/upwell-mpi/resize")[0].body
    assert resize["targetDedicatedNodes"] == 2 and resize["targetLowPriorityNodes"] == 0



def test_contract_batch_container_runs_as_the_image_user_with_writable_scratch_and_no_gpus_flag(
        server, credential, client_kwargs):
    """Issue 23, item 7, on the pool the gpu pool's options create (Bicep's run options with a --gpus given).

    "Run container applications on Azure Batch": on Linux Batch maps the task user's uid/gid into the
    container, and on GPU hardware it enables the GPUs itself ("you shouldn't include the --gpus
    argument"). So the start task runs as a pool user account with the image user's uid/gid (the owner of
    /scratch in workers/docker), and no --gpus reaches containerRunOptions. The ARM body is read back
    through the azure-batch SDK's models: a misspelt field would read as None there. (ARM spells the
    identity's name ``userName``, the data plane ``username``: that one is asserted on the body.)
    """
    server.route("GET", r"/pools/upwell-gpu", R(404, {"code": "PoolNotFound", "message": {"value": "no"}}),
                 R(200, {**pool_json(), "id": "upwell-gpu"}))
    server.route("PUT", ARM_POOL, R(200, {"properties": {"provisioningState": "Succeeded"}}))
    server.route("POST", r"/pools/upwell-gpu/resize", R(202))
    pool = make_pool(spec(server, name="gpu", gpu=True, container_run_options="--rm --network host --gpus all"),
                     credential=credential, client_kwargs=client_kwargs)
    pool.scale_to(1, spot=0)
    props = server.calls("PUT", ARM_POOL)[0].body["properties"]
    start, accounts = props["startTask"], props["userAccounts"]

    settings = m.BatchTaskContainerSettings(start["containerSettings"])
    assert settings.image_name == "upwellacr.azurecr.io/upwell-worker:1"
    assert "--gpus" not in settings.container_run_options and "--network host" in settings.container_run_options

    assert start["userIdentity"] == {"userName": "upwell"}  # not the autoUser: its uid owns nothing in the image
    account = m.UserAccount(accounts[0])
    assert [a["name"] for a in accounts] == ["upwell"] and account.name == "upwell"
    assert account.password  # required by the API, random, kept nowhere
    assert account.elevation_level == "NonAdmin"  # not root: the image's user
    assert (account.linux_user_configuration.uid, account.linux_user_configuration.gid) == (10001, 10001)
    env = {e.name: e.value for e in m.BatchStartTask(start).environment_settings}
    assert env["UPWELL_SCRATCH"] == "/scratch"

    # The image's user is that uid/gid and owns /scratch, in every worker image.
    for dockerfile in (REPO / "workers" / "docker").glob("Dockerfile*"):
        text = dockerfile.read_text()
        assert re.search(r"groupadd --gid 10001 upwell && useradd .*--uid 10001 --gid 10001", text), dockerfile
        assert "chown upwell /scratch" in text and "\nUSER upwell\n" in text, dockerfile
    assert (build_batch.IMAGE_UID, build_batch.IMAGE_GID) == (10001, 10001)
