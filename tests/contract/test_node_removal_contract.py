"""Contract tests for removing nodes by id (issue 23: dead agents, drain before scale-in): the real Azure SDK
clients against the recording server on 127.0.0.1.

What is followed: Batch's remove-nodes (POST /pools/{poolId}/removenodes, ``nodeList`` of at most 100 ids,
``nodeDeallocationOption`` requeue | terminate | taskcompletion | retaineddata; a pool takes it only while its
allocation state is steady); VMSS delete instances (POST .../virtualMachineScaleSets/{name}/delete with
``instanceIds``, which lowers the capacity with them); ACI's container group delete (DELETE .../containerGroups/
{name}).
"""

from __future__ import annotations

import pytest
from azure.core.exceptions import HttpResponseError

from tests.contract.test_aci_contract import GROUPS, group
from tests.contract.test_aci_contract import spec as aci_spec
from tests.contract.test_batch_contract import nodes_json, pool_json
from tests.contract.test_batch_contract import spec as batch_spec
from tests.contract.test_vmss_contract import SETS, vm, vmss_json
from tests.contract.test_vmss_contract import spec as vmss_spec
from upwell.errors import PoolError
from upwell.pools import make_pool


def R(status=200, body=None, headers=None):  # a reply, as the server takes it
    return status, body, headers or {}


def settle(pool) -> None:
    for p in pool.pollers:
        try:
            p.wait(timeout=10)
        except HttpResponseError:
            pass


def test_contract_batch_removes_a_dead_node_with_terminate_and_a_drained_one_with_taskcompletion(
        server, credential, client_kwargs):
    server.route("GET", r"/pools/upwell-cpu", R(200, pool_json(dedicated=3)))
    server.route("GET", r"/pools/upwell-cpu/nodes", R(200, nodes_json(
        ("n1", "idle", True), ("n2", "idle", True), ("n3", "running", True))))
    server.route("POST", r"/pools/upwell-cpu/removenodes", R(202))
    pool = make_pool(batch_spec(server), credential=credential, client_kwargs=client_kwargs)
    pool.remove(["n2", "gone"], dead=True)  # a node no longer in the pool is not asked for
    pool.remove(["n1"])
    first, second = (c.body for c in server.calls("POST", r"/pools/upwell-cpu/removenodes"))
    assert first["nodeList"] == ["n2"] and first["nodeDeallocationOption"] == "terminate"
    assert second["nodeList"] == ["n1"] and second["nodeDeallocationOption"] == "taskcompletion"
    assert first["resizeTimeout"] == "PT15M00S"
    assert not server.calls("POST", r"/pools/upwell-cpu/resize")  # removal lowers the target itself


def test_contract_batch_removes_nothing_while_the_pool_resizes(server, credential, client_kwargs):
    server.route("GET", r"/pools/upwell-cpu", R(200, pool_json(dedicated=3, state="resizing")))
    pool = make_pool(batch_spec(server), credential=credential, client_kwargs=client_kwargs)
    with pytest.raises(PoolError, match="resizing"):
        pool.remove(["n1"], dead=True)
    assert not server.calls("POST", ".*")


def test_contract_vmss_deletes_the_named_vms_by_instance_id(server, credential, client_kwargs):
    server.route("GET", rf"{SETS}/upwell-cpu", R(200, vmss_json("upwell-cpu", 3)))
    server.route("GET", rf"{SETS}/upwell-cpu/virtualMachines", R(200, {"value": [
        vm("upwell-cpu", 0), vm("upwell-cpu", 4), vm("upwell-cpu", 7)]}))
    server.route("POST", rf"{SETS}/upwell-cpu/delete", R(202, None, {"Location": "{base}/ops/d", "Retry-After": "0"}))
    server.route("GET", r"/ops/d", R(200))
    pool = make_pool(vmss_spec(), credential=credential, client_kwargs=client_kwargs)
    pool.remove(["upwell-cpu_4", "upwell-cpu_9"], dead=True)  # the agent records the VM's name as its node id
    settle(pool)
    deleted = server.calls("POST", rf"{SETS}/upwell-cpu/delete")
    assert len(deleted) == 1 and deleted[0].body == {"instanceIds": ["4"]}
    assert not server.calls("PATCH", ".*") and not server.calls("PUT", ".*")
    assert pool.status().message == ""


def test_contract_aci_deletes_the_named_group_of_its_own_pool_only(server, credential, client_kwargs):
    server.route("GET", GROUPS, R(200, {"value": [group("upwell-gpu-a"), group("upwell-gpu-b"),
                                                  group("upwell-gpu-b2", pool="cpu")]}))
    server.route("DELETE", GROUPS + r"/([\w-]+)", R(200, None, {"Location": "{base}/ops/del", "Retry-After": "0"}))
    server.route("GET", r"/ops/del", R(204))
    pool = make_pool(aci_spec(), credential=credential, client_kwargs=client_kwargs)
    pool.remove(["upwell-gpu-b", "upwell-gpu-b2"], dead=True)
    settle(pool)
    deleted = [c.path.rsplit("/", 1)[1] for c in server.calls("DELETE", GROUPS + r"/[\w-]+")]
    assert deleted == ["upwell-gpu-b"]  # b2 belongs to another pool
