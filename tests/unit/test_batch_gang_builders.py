"""The pure builders of a Batch gang pool: the pool body, the pool's job, the agent tasks and their ids."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from upwell.cost import tags
from upwell.errors import ConfigError
from upwell.pools import build_batch, build_batch_tasks
from upwell.pools.base import PoolSpec

IDENTITY = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ManagedIdentity/userAssignedIdentities/w"
NOW = datetime(2026, 12, 3, 8, 30, 59, tzinfo=UTC)


def spec(vm_size="Standard_HB120rs_v3", **options) -> PoolSpec:
    return PoolSpec("hpc", backend="batch", vm_size=vm_size, max_nodes=8, tasks_per_node=4,
                    options={"image": "lab.azurecr.io/upwell-mpi:3", "identity_id": IDENTITY,
                             "identity_client_id": "cid", "storage_account": "acct", "gangs": True, **options})


def test_a_gang_pool_talks_between_nodes_has_one_slot_a_node_an_hpc_image_and_no_start_task_agent():
    props = build_batch.pool_body(spec())["properties"]
    assert props["interNodeCommunication"] == "Enabled" and props["taskSlotsPerNode"] == 1
    vm = props["deploymentConfiguration"]["virtualMachineConfiguration"]
    assert vm["imageReference"] == {"publisher": "microsoft-dsvm", "offer": "ubuntu-hpc", "sku": "2204",
                                    "version": "latest"}
    assert "startTask" not in props  # Batch, through tasks, is the only one to hand out a node's slot
    assert props["userAccounts"][0]["name"] == build_batch.AGENT_USER  # the tasks run as the image's user
    plain = build_batch.pool_body(replace(spec(), options={**spec().options, "gangs": False}))["properties"]
    assert "startTask" in plain and plain["taskSlotsPerNode"] == 4


@pytest.mark.parametrize("size, ib", [("Standard_HB120rs_v3", True), ("Standard_HC44rs", True),
                                      ("standard_hb176rs_v4", True), ("Standard_ND96asr_v4", True),
                                      ("Standard_D32s_v4", False), ("Standard_NC24ads_A100_v4", False)])
def test_infiniband_sizes(size, ib):
    assert build_batch.has_infiniband(size) is ib


def test_a_gang_pool_on_infiniband_refuses_an_image_without_its_drivers():
    plain = {"publisher": "canonical", "offer": "ubuntu-24_04-lts", "sku": "server", "version": "latest"}
    with pytest.raises(ConfigError, match=r"options\.image_reference.*HB120rs_v3.*HPC image"):
        build_batch.pool_body(spec(image_reference=plain))
    alma = {"publisher": "microsoft-dsvm", "offer": "almalinux-hpc", "sku": "8_7-hpc-gen2", "version": "latest"}
    assert build_batch.image_reference(spec(image_reference=alma)) == alma
    assert build_batch.image_reference(spec("Standard_D32s_v4", image_reference=plain)) == plain  # no IB: any


def test_the_pool_job_is_never_terminated_by_its_own_completion():
    body = build_batch_tasks.job_body(spec())
    assert body["id"] == "upwell-pool-hpc" and body["poolInfo"] == {"poolId": "upwell-hpc"}
    assert body["onAllTasksComplete"] == "noaction" and body["usesTaskDependencies"] is False
    assert {"name": tags.POOL, "value": "hpc"} in body["metadata"]
    assert tags.JOB not in {m["name"] for m in body["metadata"]}  # the janitor's orphan scan passes it by


@pytest.mark.parametrize("n, gangs, want", [
    (6, {2: 3}, {2: 3}),  # the example: 3 two-node shards want 6 nodes
    (7, {2: 3}, {2: 3, 1: 1}),
    (5, {2: 3}, {2: 2, 1: 1}),  # n is the cap: the third gang waits
    (8, {4: 1, 2: 2}, {4: 1, 2: 2}),
    (3, {4: 1}, {1: 3}),
    (2, None, {1: 2}),
    (0, {2: 1}, {}),
    (4, {1: 5, 2: 0}, {1: 4}),  # k = 1 and empty entries are no gangs
])
def test_wanted_counts_gangs_within_n(n, gangs, want):
    assert build_batch_tasks.wanted(n, gangs) == want


def test_task_ids_are_deterministic_per_minute_unique_per_slot_and_parse_back():
    tid = build_batch_tasks.task_id(4, 2, NOW)
    assert tid == "agent-n4-s2-20261203T0830" and len(tid) <= 64
    assert build_batch_tasks.task_id(4, 2, NOW.replace(second=0)) == tid
    assert build_batch_tasks.task_id(4, 2, NOW.replace(minute=31)) != tid
    assert build_batch_tasks.parse_task_id(tid) == (4, 2)
    assert build_batch_tasks.parse_task_id("someone-elses-task") is None


def test_a_gang_task_is_a_multi_instance_task_that_runs_the_agent_on_the_primary():
    task = build_batch_tasks.agent_task(spec(), 4, "agent-n4-s0-20261203T0830")
    assert task["multiInstanceSettings"] == {"numberOfInstances": 4,
                                             "coordinationCommandLine": "/bin/sh /app/workers/docker/gang-sshd.sh"}
    assert task["commandLine"].endswith("exec python -m workers.agent --pool hpc'")
    env = {e["name"]: e["value"] for e in task["environmentSettings"]}
    assert env["UPWELL_GANG_NODES"] == "4" and env["UPWELL_SLOTS"] == "1" and env["UPWELL_IDLE_EXIT_S"] == "120"
    assert env["UPWELL_EVICTION_WATCH"] == "1" and env["UPWELL_POOL"] == "hpc"
    assert task["userIdentity"] == {"username": "upwell"} and task["requiredSlots"] == 1
    assert task["constraints"]["maxTaskRetryCount"] == 0  # capacity only: the item comes back by visibility
    assert task["containerSettings"]["workingDirectory"] == "taskWorkingDirectory"
    one = build_batch_tasks.agent_task(spec(idle_exit_s=30, coordination_command="/bin/true"), 1, "agent-n1-s0-x")
    assert "multiInstanceSettings" not in one
    assert "UPWELL_GANG_NODES" not in {e["name"] for e in one["environmentSettings"]}
    assert build_batch_tasks.coordination_command(spec(coordination_command="/bin/true")) == "/bin/true"


def test_an_agent_task_has_the_start_task_environment_and_the_gang_settings():
    """The same agent environment as a start task (upwell.pools.build_batch.start_task, which
    tests/unit/test_names_consistency.py holds to bicep), plus what an agent task adds."""
    start = {e["name"] for e in build_batch.start_task(spec(gangs=False))["environmentSettings"]}
    task = {e["name"] for e in build_batch_tasks.agent_task(spec(), 2, "t")["environmentSettings"]}
    assert task == start | {"UPWELL_SLOTS", "UPWELL_IDLE_EXIT_S", "UPWELL_GANG_NODES"}


def test_the_one_node_agents_in_the_first_min_nodes_slots_are_warm():
    """Issue 25 item 15: on a gang pool the one-node agent tasks in slots below min_nodes keep warm (the warm
    idle exit, default 0: never); the others, and every gang agent, exit after idle_exit_s."""
    def idle_exit(body):
        return {e["name"]: e["value"] for e in body["environmentSettings"]}["UPWELL_IDLE_EXIT_S"]

    two = replace(spec(), min_nodes=2)
    assert [build_batch_tasks.is_warm(two, k, slot) for k, slot in ((1, 0), (1, 1), (1, 2), (2, 0))] == [
        True, True, False, False]
    assert not build_batch_tasks.is_warm(spec(), 1, 0)  # min_nodes 0: nothing is kept warm
    assert idle_exit(build_batch_tasks.agent_task(two, 1, "t", warm=True)) == "0"
    assert idle_exit(build_batch_tasks.agent_task(two, 1, "t")) == "120"
    assert idle_exit(build_batch_tasks.agent_task(spec(warm_idle_exit_s=600), 1, "t", warm=True)) == "600"
