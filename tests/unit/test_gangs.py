"""Gangs of nodes, the pure parts: the Slurm gang job (script, squeue, scale_to's choices against a recorded
fake CLI), the Apptainer prefix, the allocation's hosts and the MPI launch over them (Slurm and Batch), and
the verdict that defers a shard of another node count. The real thing runs in tests/e2e/test_multinode.py."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.unit.test_slurm_builders import FakeSlurm, sbatch_lines, spec
from upwell.errors import ConfigError
from upwell.messages import WorkItem
from upwell.payloads.argv import values_for
from upwell.payloads.validate import load
from upwell.pools import build_slurm as build
from upwell.pools.base import NodeState
from upwell.pools.slurm import SlurmPool
from upwell.rows import JobRow, ShardRow
from upwell.shape import Shape
from upwell.verdict import AttemptConfig, VerdictKind, decide_delivery
from workers import gang
from workers.launch import build_command
from workers.runner import command_for

IMAGE = "labcr.azurecr.io/lammps@sha256:" + "a" * 64


# -- the gang job ----------------------------------------------------------------------------------------
def test_a_gang_job_asks_for_k_whole_nodes_and_runs_its_agent_as_the_batch_step():
    script = build.batch_script(spec(cores_per_node=120), python="/opt/py", workdir="/shared/upwell", nodes=4)
    lines = sbatch_lines(script)
    assert "--nodes=4" in lines and "--ntasks-per-node=120" in lines and "--exclusive" in lines
    assert not any(line.startswith(("--ntasks=", "--cpus-per-task")) for line in lines)
    assert "export UPWELL_GANG_NODES=4" in script
    assert "UPWELL_RANKS" not in script and "OMPI_MCA_plm" not in script  # the shape decides; srun launches
    last = shlex.split(script.strip().splitlines()[-1])
    assert last == ["exec", "/opt/py", "-m", "workers.agent", "--pool", "mpi", "--idle-exit", "120"]
    one = build.batch_script(spec())
    assert "--nodes=1" in sbatch_lines(one) and "UPWELL_GANG_NODES" not in one and "exec srun " in one


def test_a_gang_script_is_valid_bash(tmp_path):
    script = build.batch_script(spec(), state_dir=str(tmp_path), nodes=2)
    body = script.rsplit("\nexec ", 1)[0] + '\nenv | sort\n'
    out = subprocess.run(["bash", "-c", body], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "9"}).stdout
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    assert env["UPWELL_GANG_NODES"] == "2" and env["UPWELL_NODE_ID"] == "slurm-mpi-9"
    assert env["UPWELL_STATE_FILE"] == f"{tmp_path}/mpi/9.json"


def test_rest_gang_job_and_the_node_count_read_back():
    job = build.rest_job(spec(cores_per_node=8), "", {}, nodes=3)["job"]
    assert job["nodes"] == "3" and job["tasks_per_node"] == 8 and job["exclusive"] == "exclusive"
    assert "tasks" not in job and "cpus_per_task" not in job
    doc = {"jobs": [{"job_id": 5, "name": "upwell-mpi", "comment": "upwell-pool=mpi", "job_state": "RUNNING",
                     "node_count": 3}]}
    assert [j.size for j in build.parse_rest_jobs(doc, spec())] == [3]
    assert build.scancel_argv(["5"], signal="USR1", batch=True) == ["scancel", "--batch", "--signal=USR1", "5"]


def test_scale_to_keeps_the_gangs_asked_for_and_fills_the_rest_with_one_node_agents():
    fake = FakeSlurm([("1", "RUNNING")])
    pool = SlurmPool(spec(), client=fake)
    pool.scale_to(7, gangs={2: 1, 3: 1})  # 2 + 3 nodes in gangs, 2 one-node agents (one is there)
    sizes = sorted(next(int(line.split("=")[1]) for line in sbatch_lines(s) if line.startswith("--nodes="))
                   for s in fake.scripts)
    assert sizes == [1, 2, 3]
    fake.rows = [("1", "RUNNING"), ("101", "RUNNING"), ("102", "PENDING", 2), ("103", "RUNNING", 3)]
    status = pool.status(busy={"slurm-mpi-103"})
    assert status.target == 7 and status.alive == 7  # a gang job counts as its nodes
    assert status.nodes["slurm-mpi-103"] is status.nodes["slurm-mpi-103+2"] is NodeState.RUNNING
    assert status.nodes["slurm-mpi-102+1"] is NodeState.PENDING
    fake.calls.clear()
    pool.scale_to(7, gangs={2: 1, 3: 1}, busy={"slurm-mpi-103"})
    assert not any(c[0] in ("sbatch", "scancel") for c in fake.calls)  # already as asked


def test_scale_in_removes_unwanted_gangs_and_never_a_busy_one():
    fake = FakeSlurm([("1", "RUNNING", 2), ("2", "PENDING", 2), ("3", "RUNNING", 2), ("4", "RUNNING")])
    pool = SlurmPool(spec(), client=fake)
    pool.scale_to(0, busy={"slurm-mpi-3"})
    assert ["scancel", "2"] in fake.calls  # pending: cancelled
    assert ["scancel", "--batch", "--signal=USR1", "1"] in fake.calls  # an idle gang's agent is the batch step
    assert ["scancel", "--signal=USR1", "4"] in fake.calls  # a one-node agent is a step
    assert not any("3" in c for c in fake.calls if c[0] == "scancel")


# -- Apptainer ---------------------------------------------------------------------------------------------
def test_apptainer_runs_the_image_by_digest_with_nv_for_gpus():
    assert build.apptainer_exec(IMAGE, binds=("/scratch/w",)) == [
        "apptainer", "exec", "--bind", "/scratch/w", f"docker://{IMAGE}"]
    assert build.apptainer_exec(IMAGE, gpus=1)[:3] == ["apptainer", "exec", "--nv"]
    with pytest.raises(ConfigError, match="digest"):
        build.apptainer_exec("labcr.azurecr.io/lammps:latest")
    assert "export UPWELL_APPTAINER=1" in build.batch_script(spec(apptainer=True), nodes=2)
    assert gang.container_prefix(IMAGE, 0, "/w", apptainer=False) == []
    assert gang.container_prefix(IMAGE, 2, "/w", apptainer=True)[2] == "--nv"


# -- the allocation and the launch over it -----------------------------------------------------------------
def test_hosts_of_a_slurm_allocation_and_of_a_batch_task():
    assert gang.hosts({"SLURM_JOB_NODELIST": "hb[1-2]"}, expand=lambda s: {"hb[1-2]": ["hb1", "hb2"]}[s]) == [
        "hb1", "hb2"]
    assert gang.hosts({"AZ_BATCH_HOST_LIST": "10.0.0.4,10.0.0.5"}) == ["10.0.0.4", "10.0.0.5"]
    assert gang.hosts({}) == []
    assert gang.gang_nodes({"UPWELL_GANG_NODES": "4"}) == 4 and gang.gang_nodes({}) == 1


def test_launch_over_the_allocation():
    slurm = gang.launch_argv(Shape(2, 4), cores=120, env={"SLURM_JOB_ID": "7"})
    assert slurm == ["srun", "--mpi=pmix", "--nodes=2", "--ntasks=4", "--ntasks-per-node=2", "--cpus-per-task=60",
                     "--overlap", "--kill-on-bad-exit=0"]
    assert gang.launch_argv(Shape(2, 6, True), cores=2, env={"SLURM_JOB_ID": "7"})[-1] == "--overcommit"
    batch = gang.launch_argv(Shape(2, 3), cores=4, env={"AZ_BATCH_HOST_LIST": "10.0.0.4,10.0.0.5"})
    assert batch == ["mpirun", "--host", "10.0.0.4:2,10.0.0.5:2", "-n", "3"]
    with pytest.raises(ConfigError, match="1 host"):
        gang.launch_argv(Shape(2, 2), cores=4, env={"AZ_BATCH_HOST_LIST": "10.0.0.4"})


def test_the_builtin_mpi_payload_of_two_nodes_launches_through_srun(monkeypatch):
    from upwell.payloads import builtin as registry

    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "2")
    item = WorkItem(job_id="j", shard_id="s", payload="heat-mpi", pool="mpi", ranks=2, nodes=2)
    argv = build_command(registry.get("heat-mpi"), item, Path("/w"))
    assert argv[:5] == ["srun", "--mpi=pmix", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1"]
    assert argv[-4:] == ["-m", "workers.payloads.heat", "--workdir", "/w"]


def test_a_byo_mpi_definition_of_two_nodes_swaps_its_mpiexec_for_the_gang_launch(monkeypatch, tmp_path):
    doc = {"schema": 1, "name": "ring", "version": "1.0.0", "owner": "lab", "image": IMAGE,
           "command": ["python3", "ring.py", "--steps", "{steps}"], "params": {"steps": {"type": "int", "default": 3}},
           "launcher": {"kind": "mpi", "mpiexec": ["mpiexec", "-n", "{ranks}"]},
           "resources": {"nodes": 2, "ranks_per_node": 1}}
    d = load(yaml.safe_dump(doc).encode(), "ring.yaml", ("*.azurecr.io",)).definition
    item = WorkItem(job_id="j", shard_id="s", payload="ring", pool="mpi", ranks=2, nodes=2)
    values = values_for(d, item, tmp_path, {"steps": 3})
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv("AZ_BATCH_HOST_LIST", "h1,h2")
    assert command_for(d, item, values, tmp_path, False) == [
        "mpirun", "--host", "h1:1,h2:1", "-n", "2", "python3", "ring.py", "--steps", "3"]
    one = WorkItem(job_id="j", shard_id="s", payload="ring", pool="mpi", ranks=2)
    assert command_for(d, one, values, tmp_path, False)[:3] == ["mpiexec", "-n", "2"]  # its own launcher
    assert command_for(d, item, values, tmp_path, False, apptainer=True)[5:9] == [
        "apptainer", "exec", "--bind", str(tmp_path)]


# -- the verdict -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("nodes, agent_nodes, kind", [
    (1, 1, VerdictKind.RUN), (2, 2, VerdictKind.RUN), (2, 1, VerdictKind.DEFER), (1, 2, VerdictKind.DEFER),
    (3, 2, VerdictKind.DEFER)])
def test_an_agent_runs_only_its_own_node_count_and_defers_the_rest(nodes, agent_nodes, kind):
    verdict = decide_delivery(decoded=True, result_exists=False, dequeue_count=9, shard=ShardRow(deferrals=8),
                              job=JobRow(), config=AttemptConfig(max_failures=5), nodes=nodes,
                              agent_nodes=agent_nodes)
    assert verdict.kind is kind
    if kind is VerdictKind.DEFER:
        assert f"runs on {nodes} node(s)" in verdict.reason and verdict.delay_s == 2


def test_ranks_that_slurm_ended_with_sigterm_are_a_preemption_of_a_gang_only():
    slurm = {"SLURM_JOB_ID": "7"}
    assert gang.stopped_by_slurm(143, 2, slurm)  # srun: 128 + SIGTERM
    assert not gang.stopped_by_slurm(143, 1, slurm) and not gang.stopped_by_slurm(1, 2, slurm)
    assert not gang.stopped_by_slurm(None, 2, slurm) and not gang.stopped_by_slurm(143, 2, {})
