"""Contract tests for Batch gangs: the real azure-batch BatchClient (and the ARM pipeline for the pool)
against the recording server on 127.0.0.1, driven through ``scale_to(n, gangs=...)`` as the Autoscaler does.

What is asserted is the requests' shape and order: the gang pool (inter-node communication, one task slot
a node, the HPC image, no start-task agent); the pool's one job (``onAllTasksComplete`` noaction, made
when the list finds none, a 409 JobExists taken as success); the live tasks listed with a filter on state,
a surplus one that waits for nodes ended (never a running one); one multi-instance task per wanted gang
beyond the live ones (multiInstanceSettings, commands, environment, user identity), each read back
through the SDK's models (a misspelt field would read as None there); and that nothing ends the job
before its tasks are added.
"""

from __future__ import annotations

import re

import pytest
from azure.batch import models as m

from tests.contract.busy import with_busy
from upwell.errors import PoolError
from upwell.pools import make_pool
from upwell.pools.base import PoolSpec


def R(status=200, body=None, headers=None):
    return status, body, headers or {}


def B(code, message, status=409):  # Batch's data-plane error
    return status, {"code": code, "message": {"lang": "en-US", "value": message}}, {}


IDENTITY = "/subscriptions/s1/resourceGroups/rg/providers/Microsoft.ManagedIdentity/userAssignedIdentities/worker"
ARM_POOL = r"/subscriptions/s1/resourceGroups/rg/providers/Microsoft\.Batch/batchAccounts/acct/pools/upwell-hpc"
JOB = "upwell-pool-hpc"
TASK_ID = re.compile(r"^agent-n(\d+)-s(\d+)-\d{8}T\d{4}$")


def make(server, credential, client_kwargs, min_nodes=0, **options):
    spec = PoolSpec("hpc", backend="batch", vm_size="Standard_HB120rs_v3", max_nodes=8, spot_share=0.0,
                    min_nodes=min_nodes,
                    options={"account_url": server.url, "subscription_id": "s1", "resource_group": "rg",
                             "account_name": "acct", "image": "upwellacr.azurecr.io/upwell-mpi:1",
                             "identity_id": IDENTITY, "identity_client_id": "cid-123",
                             "storage_account": "upwellstore", "gangs": True, **options})
    return with_busy(make_pool(spec, credential=credential, client_kwargs=client_kwargs), ())


def pool_json(dedicated=0, state="steady"):
    return {"id": "upwell-hpc", "allocationState": state, "targetDedicatedNodes": dedicated,
            "targetLowPriorityNodes": 0, "resizeErrors": []}


NO_JOB = B("JobNotFound", "The specified job does not exist.", 404)


def routes(server, *, pool=None, tasks=None, job=R(201)):
    """The pool; the job (none yet unless ``tasks`` lists its live tasks: [(id, state)])."""
    server.route("GET", r"/pools/upwell-hpc", R(200, pool or pool_json()))
    server.route("POST", r"/pools/upwell-hpc/resize", R(202))
    server.route("POST", r"/jobs", job)
    listed = R(200, {"value": [{"id": t, "state": s} for t, s in tasks or ()]})
    server.route("GET", rf"/jobs/{JOB}/tasks", *((listed,) if tasks is not None else (NO_JOB, listed)))
    server.route("POST", rf"/jobs/{JOB}/tasks", R(201))
    server.route("POST", rf"/jobs/{JOB}/tasks/[^/]+/terminate", R(204))


def added(server) -> list[m.BatchTaskCreateOptions]:
    return [m.BatchTaskCreateOptions(r.body) for r in server.calls("POST", rf"/jobs/{JOB}/tasks")]


def test_contract_gang_pool_is_made_for_multi_instance_tasks(server, credential, client_kwargs):
    routes(server)
    server.route("PUT", ARM_POOL, R(200, {"properties": {"provisioningState": "Succeeded"}}))
    server.route("GET", r"/pools/upwell-hpc", R(404, {"code": "PoolNotFound", "message": {"value": "no"}}),
                 R(200, pool_json()))
    make(server, credential, client_kwargs).scale_to(2, gangs={2: 1})
    props = server.calls("PUT", ARM_POOL)[0].body["properties"]
    assert props["interNodeCommunication"] == "Enabled" and props["taskSlotsPerNode"] == 1
    vm = props["deploymentConfiguration"]["virtualMachineConfiguration"]
    assert (vm["imageReference"]["publisher"], vm["imageReference"]["offer"]) == ("microsoft-dsvm", "ubuntu-hpc")
    assert "startTask" not in props  # the agents are the tasks below; no second agent competes for the node
    assert props["vmSize"] == "Standard_HB120rs_v3"


def test_contract_gang_job_then_one_multi_instance_task_per_wanted_gang(server, credential, client_kwargs):
    routes(server)
    pool = make(server, credential, client_kwargs)
    pool.scale_to(6, gangs={2: 3})

    resize = server.calls("POST", r"/pools/upwell-hpc/resize")[0].body
    assert resize["targetDedicatedNodes"] == 6  # the pool's nodes cover n
    job = m.BatchJobCreateOptions(server.calls("POST", r"/jobs")[0].body)
    assert job.id == JOB and job.pool_info.pool_id == "upwell-hpc"
    assert job.all_tasks_complete_mode == "noaction" and job.uses_task_dependencies is False
    listed = server.calls("GET", rf"/jobs/{JOB}/tasks")[0]
    assert listed.q("$filter") == "state eq 'active' or state eq 'preparing' or state eq 'running'"

    tasks = added(server)
    assert len(tasks) == 3 and len({t.id for t in tasks}) == 3
    assert sorted(TASK_ID.match(t.id).groups() for t in tasks) == [("2", "0"), ("2", "1"), ("2", "2")]
    task = tasks[0]
    assert task.multi_instance_settings.number_of_instances == 2
    assert task.multi_instance_settings.coordination_command_line == "/bin/sh /app/workers/docker/gang-sshd.sh"
    assert "exec python -m workers.agent --pool hpc" in task.command_line
    env = {e.name: e.value for e in task.environment_settings}
    assert env["UPWELL_GANG_NODES"] == "2" and env["UPWELL_POOL"] == "hpc" and env["UPWELL_SLOTS"] == "1"
    assert env["AZURE_CLIENT_ID"] == "cid-123" and env["AzureWebJobsStorage__accountName"] == "upwellstore"
    assert task.user_identity.username == "upwell"
    assert task.container_settings.image_name == "upwellacr.azurecr.io/upwell-mpi:1"
    assert task.container_settings.registry.identity_reference.resource_id == IDENTITY
    assert "--network host" in task.container_settings.container_run_options  # AZ_BATCH_HOST_LIST are host IPs
    assert task.constraints.max_task_retry_count == 0 and task.required_slots == 1

    order = [(r.method, r.path) for r in server.requests if r.method == "POST" or "/tasks" in r.path]
    assert order == [("POST", "/pools/upwell-hpc/resize"), ("GET", f"/jobs/{JOB}/tasks"), ("POST", "/jobs"),
                     ("POST", f"/jobs/{JOB}/tasks"), ("POST", f"/jobs/{JOB}/tasks"), ("POST", f"/jobs/{JOB}/tasks")]

    server.route("GET", rf"/jobs/{JOB}/tasks", R(200, {"value": [{"id": t.id, "state": "running"} for t in tasks]}))
    pool.scale_to(6, gangs={2: 3})  # the job exists now (listed): not created again; nothing missing
    assert len(server.calls("POST", r"/jobs")) == 1 and len(added(server)) == 3


def test_contract_gang_job_is_not_terminated_before_its_tasks_are_added(server, credential, client_kwargs):
    """onAllTasksComplete=terminatejob on a job with no tasks ends it at once ("if a Job contains no Tasks,
    then all Tasks are considered complete"): no request before the first task add may ask for it, and
    nothing terminates or patches the job at all."""
    routes(server)
    make(server, credential, client_kwargs).scale_to(4, gangs={4: 1})
    first_add = next(i for i, r in enumerate(server.requests) if r.method == "POST" and r.path.endswith("/tasks"))
    for r in server.requests[:first_add]:
        assert "terminatejob" not in str(r.body).lower(), (r.method, r.path)
    assert server.calls("POST", r"/jobs")[0].body["onAllTasksComplete"] == "noaction"
    assert not server.calls("POST", r"/jobs/.*/terminate") and not server.calls("PATCH", ".*")
    assert not server.calls("PUT", r"/jobs/.*")
    assert added(server)[0].multi_instance_settings.number_of_instances == 4


def test_contract_gang_job_made_meanwhile_is_success(server, credential, client_kwargs):
    """The list finds no job, another scaler makes it before this one does: 409 JobExists is success."""
    routes(server, job=B("JobExists", "The specified job already exists."))
    make(server, credential, client_kwargs).scale_to(2, gangs={2: 1})
    assert len(server.calls("POST", r"/jobs")) == 1
    assert [t.multi_instance_settings.number_of_instances for t in added(server)] == [2]


def test_contract_gang_live_tasks_are_counted_and_waiting_surplus_ended(server, credential, client_kwargs):
    live = [("agent-n2-s0-20261203T0700", "running"), ("agent-n2-s3-20261203T0701", "active"),
            ("agent-n4-s0-20261203T0702", "running"), ("agent-n4-s1-20261203T0702", "active"),
            ("someone-elses-task", "running")]
    routes(server, pool=pool_json(dedicated=7), tasks=live)
    make(server, credential, client_kwargs).scale_to(7, gangs={2: 3})  # 3 gangs of 2 and a one-node agent
    assert not server.calls("POST", r"/jobs")  # listed: the job exists
    tasks = added(server)
    got = sorted(TASK_ID.match(t.id).groups() for t in tasks)
    assert got == [("1", "0"), ("2", "1")]  # the one missing gang takes the first free slot
    one = next(t for t in tasks if t.id.startswith("agent-n1-"))
    assert one.multi_instance_settings is None
    assert "UPWELL_GANG_NODES" not in {e.name for e in one.environment_settings}
    ended = [r.path.split("/")[-2] for r in server.calls("POST", rf"/jobs/{JOB}/tasks/[^/]+/terminate")]
    assert ended == ["agent-n4-s1-20261203T0702"]  # no 4-node gang wanted: the waiting one ends, never a running one
    assert not server.calls("POST", r"/pools/upwell-hpc/resize")  # already at 7


def test_contract_the_first_min_nodes_one_node_agent_tasks_keep_warm(server, credential, client_kwargs):
    """Issue 25 item 15: with min_nodes 1, the one-node agent task in slot 0 never exits on idle; the others
    and the gang's agent exit after idle_exit_s (120 s)."""
    routes(server, pool=pool_json(dedicated=4))
    make(server, credential, client_kwargs, min_nodes=1).scale_to(4, gangs={2: 1})
    idle = {TASK_ID.match(t.id).groups(): {e.name: e.value for e in t.environment_settings}["UPWELL_IDLE_EXIT_S"]
            for t in added(server)}
    assert idle == {("1", "0"): "0", ("1", "1"): "120", ("2", "0"): "120"}, idle


def test_contract_gang_tasks_wait_for_nodes_while_the_pool_resizes(server, credential, client_kwargs):
    routes(server, pool=pool_json(dedicated=2, state="resizing"))
    make(server, credential, client_kwargs).scale_to(4, gangs={4: 1})
    assert not server.calls("POST", r"/pools/upwell-hpc/resize")  # one resize at a time
    assert [t.multi_instance_settings.number_of_instances for t in added(server)] == [4]


def test_contract_gang_job_being_deleted_is_a_pool_error(server, credential, client_kwargs):
    """A 409 that is not JobExists (the job is going away) adds no task to it."""
    routes(server, job=B("JobBeingDeleted", "The specified job has been marked for deletion."))
    with pytest.raises(PoolError) as err:
        make(server, credential, client_kwargs).scale_to(2, gangs={2: 1})
    assert "JobBeingDeleted" in str(err.value) and "pool hpc" in str(err.value)
    assert not server.calls("POST", rf"/jobs/{JOB}/tasks")


def test_contract_a_pool_without_gangs_makes_no_job(server, credential, client_kwargs):
    routes(server)
    make(server, credential, client_kwargs, gangs=False).scale_to(2)
    assert not server.calls("POST", r"/jobs") and not server.calls("GET", r"/jobs/.*")
