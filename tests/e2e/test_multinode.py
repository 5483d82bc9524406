"""Multi-node MPI against a real two-node Slurm (issue 22's acceptance a-e): Debian's slurmctld and two
slurmd, n1 on 127.0.0.2 and n2 on 127.0.0.3, each in a UTS namespace of its own so that its job steps and
MPI ranks see their node's name as the host (upwell.local.slurm_cluster.LocalSlurm with ``hosts=True``).

A shard of ``nodes: 2`` runs in one gang job (``sbatch --nodes=2``) whose one agent launches the heat payload
with ``srun --mpi=pmix`` over both nodes. A missing Slurm, unshare or PMIx FAILS these tests with how to
install it (``make slurm``); they never skip. One cluster and one pool serve the module.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.heat_reference import solve_serial
from tests.pipeline_helpers import wait_for
from tests.slurm_fixture import running_slurm
from upwell import logs, names
from upwell.ingest.ingestor import Ingestor
from upwell.ledger import Ledger
from upwell.local.slurm_cluster import LocalSlurm
from upwell.messages import decode
from upwell.payloads.models import HeatParams
from upwell.payloads.registry import Registry
from upwell.pools import make_pool
from upwell.pools.base import NodeState, PoolSpec
from upwell.pools.slurm import FINISHED, SlurmPool
from upwell.settings import Settings
from upwell.storage import Storage
from workers.launch import run_payload
from workers.payloads.heat import Grid
from workers.staging import Staging

pytestmark = pytest.mark.multinode
REPO = Path(__file__).resolve().parents[2]

SMALL = {"nx": 64, "t_end": 0.01}
LONG = {"nx": 32, "cfl": 0.01, "t_end": 0.4, "checkpoint_every": 2000}  # about 45k steps: time to stop it


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurm]:
    with running_slurm(tmp_path_factory.mktemp("slurm2"), nodes=("n1", "n2"), cpus=2, hosts=True) as slurm:
        yield slurm


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> PoolSpec:
    root = tmp_path_factory.mktemp("gangs")
    return PoolSpec("mpi", backend="slurm", max_nodes=2, options={
        "state_dir": str(root / "state"), "idle_exit_s": 4, "output": str(root / "job-%j.out"),
        "cores_per_node": 2, "env": {"UPWELL_SCRATCH": str(root / "scratch"), "UPWELL_LEASE_S": "10"}})


@pytest.fixture(scope="module")
def store(azurite, cluster: LocalSlurm) -> Iterator[Storage]:
    """Azurite, and what sbatch hands on to the agents (SLURM_CONF, the storage connection)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(names.CONNECTION, azurite.connection_string)
        mp.setenv("SLURM_CONF", str(cluster.conf))
        mp.setenv("OMPI_ALLOW_RUN_AS_ROOT", "1")
        mp.setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        s = Storage(azurite.connection_string)
        s.ensure()
        s.queue(names.work_queue("mpi")).clear_messages()
        yield s


@pytest.fixture
def pool(store: Storage, cluster: LocalSlurm, spec: PoolSpec) -> Iterator[SlurmPool]:
    # An agent cancelled by an earlier test's teardown may have left its work dir (and checkpoint) behind,
    # and an earlier test that failed early its work items: neither is this test's work.
    shutil.rmtree(spec.options["env"]["UPWELL_SCRATCH"], ignore_errors=True)
    store.queue(names.work_queue("mpi")).clear_messages()
    made = make_pool(spec)
    assert isinstance(made, SlurmPool)
    yield made
    cluster.run("scancel", "--user=root", check=False)  # whatever a failed test left behind
    wait_for(lambda: not cluster.run("squeue", "--noheader", check=False).strip(), 60, "the queue to empty")


def _ingest(store: Storage, spec: PoolSpec, name: str, resources: str, params: dict) -> str:
    manifest = (f"payload: heat-mpi\npool: mpi\nresources: {resources}\nparams: {json.dumps(params)}\n"
                "grid: {alpha: [1.0]}\n").encode()
    store.blob(names.INCOMING, name).upload_blob(manifest, overwrite=True)
    return Ingestor(store, Settings(pools={"mpi": spec})).ingest(name).job_id


def _logs(spec: PoolSpec) -> str:
    out = Path(spec.options["output"]).parent
    return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(out.glob("job-*.out")))


def _result(store: Storage, spec: PoolSpec, job_id: str, timeout: float = 120) -> dict:
    blob = f"results/{job_id}/s00000.json"
    return wait_for(lambda: store.exists(blob) and json.loads(store.read(blob)), timeout, f"{blob}",
                    lambda: _logs(spec), poll_s=0.3)


def _reference_l2(params: dict) -> float:
    g = Grid.from_params(HeatParams(**params))
    diff = solve_serial(g) - g.exact(g.steps)
    return float((diff * diff).sum() * g.hx * g.hy) ** 0.5


def _first_checkpoint(spec: PoolSpec, cluster: LocalSlurm) -> None:
    scratch = Path(spec.options["env"]["UPWELL_SCRATCH"])
    wait_for(lambda: list(scratch.glob("upwell-*/work/ckpt/progress.json")), 120, "the payload's first checkpoint",
             lambda: f"{cluster.run('squeue', check=False)}\n{_logs(spec)}", poll_s=0.2)


def _gang_job(pool: SlurmPool) -> str:
    (job,) = [j.job_id for j in pool.jobs() if j.size == 2 and j.state == "RUNNING"]
    return job


def test_a_two_node_shard_runs_over_both_nodes_and_matches_one_node(store, cluster, spec, pool):
    """a. nodes: 2, ranks_per_node: 1 runs in one gang job over n1 and n2; a one-node shard of the same
    problem runs beside it on a one-node agent; each agent defers the other's shape; the l2 errors agree."""
    two = _ingest(store, spec, "multi/two/job.yaml", "{nodes: 2, ranks_per_node: 1}", SMALL)
    one = _ingest(store, spec, "multi/one/job.yaml", "{ranks: 1}", SMALL)
    pool.scale_to(3, gangs={2: 1})
    status = pool.status()
    assert status.target == 3, status  # the gang job counts as its two nodes
    gang_ids = [n for n in status.nodes if n.endswith("+1")]  # Slurm may have started it already
    assert len(gang_ids) == 1 and status.nodes[gang_ids[0]] in (NodeState.PENDING, NodeState.IDLE,
                                                                NodeState.RUNNING), status
    wide, narrow = _result(store, spec, two), _result(store, spec, one)
    assert wide["status"] == "succeeded" and narrow["status"] == "succeeded", (wide["error"], narrow["error"])
    assert wide["metrics"]["hosts"] == ["n1", "n2"], wide["metrics"]  # each rank's own machine
    assert wide["provenance"]["hosts"] == ["n1", "n2"], wide["provenance"]  # the allocation the agent held
    assert wide["metrics"]["ranks"] == 2 and narrow["metrics"]["ranks"] == 1
    assert abs(wide["metrics"]["l2_error"] - narrow["metrics"]["l2_error"]) <= 1e-12
    assert abs(wide["metrics"]["l2_error"] - _reference_l2(SMALL)) <= 1e-12
    assert wide["node"]["id"] != narrow["node"]["id"]
    assert not Ledger(store).shard(two, "s00000").failures and not Ledger(store).shard(one, "s00000").failures


def _resume_on_one_node(store: Storage, job_id: str, tmp_path: Path) -> None:
    """The gang's checkpoint, read as the next allocation reads it, resumes at another node count too: here
    one rank on this machine, to the uninterrupted result."""
    (msg,) = [m for m in store.queue(names.work_queue("mpi")).peek_messages(max_messages=32) if job_id in m.content]
    item = decode(msg.content)
    resume = Staging(store, str(tmp_path), logs.get("test")).checkpoint_in(item, tmp_path)
    assert resume is not None, "no checkpoint for the next allocation"
    one = dataclasses.replace(item, nodes=1, ranks=1, attempt=2)
    result = run_payload(one, tmp_path / "work", resume_dir=resume)
    assert result.status == "succeeded" and result.metrics["resumed_from_step"] > 0, result.stderr_tail
    assert result.metrics["ranks"] == 1 and abs(result.metrics["l2_error"] - _reference_l2(LONG)) <= 1e-12


def test_b_scancel_term_checkpoints_and_the_next_gang_resumes_to_the_same_result(store, cluster, spec, pool,
                                                                                   tmp_path):
    """b. scancel --signal=TERM reaches the agent and both ranks: checkpoint, the item goes back, and a new gang
    job resumes from the checkpoint to the uninterrupted result (which one rank from the same checkpoint also
    reaches: the resume works at another node count)."""
    job_id = _ingest(store, spec, "multi/term/job.yaml", "{nodes: 2, ranks_per_node: 1}", LONG)
    pool.scale_to(2, gangs={2: 1})
    _first_checkpoint(spec, cluster)
    cluster.run("scancel", "--signal=TERM", _gang_job(pool))
    ledger = Ledger(store)
    wait_for(lambda: getattr(ledger.shard(job_id, "s00000"), "status", None) == "preempted", 60, "the preemption",
             lambda: _logs(spec))
    assert list(store.list(names.CHECKPOINTS, f"{job_id}/s00000/")), "no checkpoint was uploaded"
    wait_for(lambda: all(j.state in FINISHED for j in pool.jobs()), 60, "the preempted gang to leave",
             lambda: _logs(spec))
    job_logs = _logs(spec)  # the ranks checkpointed and exited 75, and srun passed it on: nothing tore them down
    preempted = [json.loads(line) for line in job_logs.splitlines() if '"agent.preempted"' in line]
    log_blob = f"results/{job_id}/s00000/payload.log"  # kept only when the payload printed something
    payload_log = store.read(log_blob).decode(errors="replace")[-3000:] if store.exists(log_blob) else "(no output)"
    assert [p["exit_code"] for p in preempted] == [75], f"{job_logs}\n== payload.log\n{payload_log}"
    _resume_on_one_node(store, job_id, tmp_path)
    pool.scale_to(2, gangs={2: 1})
    result = _result(store, spec, job_id, 180)
    assert result["status"] == "succeeded", result["error"]
    assert result["metrics"]["resumed_from_step"] > 0 and result["timings"]["preemptions"] == 1
    assert result["metrics"]["hosts"] == ["n1", "n2"]
    assert abs(result["metrics"]["l2_error"] - _reference_l2(LONG)) <= 1e-12
    shard = ledger.shard(job_id, "s00000")
    assert shard.preemptions == 1 and not shard.failures


def test_c_a_node_set_down_mid_run_loses_no_shard(store, cluster, spec, pool):
    """c. n2 goes DOWN under a running gang: Slurm ends the job, the item comes back (checkpointed, or by
    its lease), and once n2 is back a new gang job finishes the shard from its checkpoint."""
    job_id = _ingest(store, spec, "multi/down/job.yaml", "{nodes: 2, ranks_per_node: 1}", LONG)
    pool.scale_to(2, gangs={2: 1})
    _first_checkpoint(spec, cluster)
    gang = _gang_job(pool)
    cluster.run("scontrol", "update", "nodename=n2", "state=down", "reason=upwell-test")
    try:
        wait_for(lambda: {j.job_id: j.state for j in pool.jobs()}.get(gang) in FINISHED | {"NODE_FAIL"}, 60,
                 "the gang job to end", lambda: cluster.run("squeue", check=False))
    finally:
        cluster.run("scontrol", "update", "nodename=n2", "state=resume", check=False)
    cluster.wait_idle(30)
    pool.scale_to(2, gangs={2: 1})
    result = _result(store, spec, job_id, 180)
    assert result["status"] == "succeeded", result["error"]
    # Slurm's node-failure kill reached the agent and the ranks: they checkpointed, and the next gang resumed.
    assert result["metrics"]["resumed_from_step"] > 0 and result["timings"]["attempt"] == 2, result["timings"]
    assert not Ledger(store).shard(job_id, "s00000").failures
    assert abs(result["metrics"]["l2_error"] - _reference_l2(LONG)) <= 1e-12
    poisoned = store.queue(names.poison_queue(names.work_queue("mpi"))).peek_messages(max_messages=32)
    assert not [m for m in poisoned if job_id in m.content]


def test_scale_in_drains_an_idle_gang_and_the_job_completes(store, cluster, spec):
    """An idle gang's agent is the batch step: the pool's drain reaches it (scancel --batch --signal=USR1) and
    the job ends COMPLETED, not cancelled; until then the status counts its two nodes."""
    pool = make_pool(dataclasses.replace(spec, options={**spec.options, "idle_exit_s": 300}))
    earlier = {j.job_id for j in pool.jobs()}  # Slurm still lists the module's earlier jobs (MinJobAge)
    try:
        pool.scale_to(2, gangs={2: 1})
        wait_for(lambda: pool.status().idle == 2, 60, "the gang's agent idle on its two nodes",
                 lambda: f"{pool.status()}\n{_logs(spec)}")
        (job,) = [j.job_id for j in pool.jobs() if j.job_id not in earlier]
        pool.scale_to(0)
        assert pool.status().alive == 0  # leaving
        ended = wait_for(lambda: {j.job_id: j.state for j in pool.jobs()}.get(job) in FINISHED
                         and {j.job_id: j.state for j in pool.jobs()}[job], 60, "the drained gang to end",
                         lambda: _logs(spec))
        assert ended == "COMPLETED", ended
    finally:
        cluster.run("scancel", "--user=root", check=False)


def _docs_definition() -> bytes:
    """The worked BYO definition of docs/mpi.md, with the venv's interpreter (which has mpi4py) standing in for
    the image's python3."""
    text = (REPO / "docs" / "mpi.md").read_text()
    block = text.split("## A worked example", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    doc = yaml.safe_load(block)
    assert doc["resources"] == {"nodes": 2, "ranks_per_node": 1} and doc["command"][0] == "python3"
    doc["command"][0] = "{python}"
    return yaml.safe_dump(doc, sort_keys=False).encode()


def test_a_byo_mpi4py_definition_of_two_nodes_runs_over_both(store, cluster, spec, pool):
    """a (BYO). The docs' mpi-pi definition (nodes: 2 in the definition itself): its mpiexec line gives way to
    srun --mpi=pmix over the gang's two nodes; every rank reports its host."""
    Registry(store).push(_docs_definition(), "mpi-pi.yaml")
    store.blob(names.INCOMING, "multi/pi/job.yaml").upload_blob(b"payload: mpi-pi\npool: mpi\ngrid: {n: [200000]}\n",
                                                                overwrite=True)
    job_id = Ingestor(store, Settings(pools={"mpi": spec})).ingest("multi/pi/job.yaml").job_id
    pool.scale_to(2, gangs={2: 1})
    result = _result(store, spec, job_id)
    assert result["status"] == "succeeded", (result["error"], result["stderr_tail"])
    assert abs(result["metrics"]["pi"] - 3.141592653589793) < 1e-9 and result["metrics"]["ranks"] == 2
    assert result["metrics"]["hosts"] == ["n1", "n2"] and result["provenance"]["hosts"] == ["n1", "n2"]


def _refusal(store: Storage, name: str) -> dict:
    return json.loads(store.read(f"{names.QUARANTINE}/{name}.error.json"))


def test_d_three_nodes_of_a_two_node_pool_is_refused_at_submit(store, spec):
    """d. 3 nodes asked of a pool of at most 2: quarantined at submit with TooManyNodes, never queued."""
    job_id = _ingest(store, spec, "multi/three/job.yaml", "{nodes: 3, ranks_per_node: 1}", SMALL)
    error = _refusal(store, "multi/three/job.yaml")
    assert error["error"] == "TooManyNodes" and "max_nodes" in error["message"], error
    assert not Ledger(store).shards(job_id)


def test_e_more_ranks_per_node_than_cores_is_refused_unless_asked(store, spec):
    """e. 3 ranks per node on 2-core nodes: Oversubscribed at submit; with oversubscribe: true it is taken."""
    _ingest(store, spec, "multi/over/job.yaml", "{nodes: 2, ranks_per_node: 3}", SMALL)
    error = _refusal(store, "multi/over/job.yaml")
    assert error["error"] == "Oversubscribed" and "cores=2" in json.dumps(error), error
    allowed = _ingest(store, spec, "multi/asked/job.yaml", "{nodes: 2, ranks_per_node: 3, oversubscribe: true}",
                      SMALL)
    assert [s.shard_id for s in Ledger(store).shards(allowed)] == ["s00000"]
    store.queue(names.work_queue("mpi")).clear_messages()


def test_the_cluster_is_two_hosts(cluster):
    """The arrangement the tests rest on: each node is its own host name on its own address."""
    out = cluster.run("srun", "--nodes=2", "--ntasks-per-node=1", "hostname")
    assert sorted(out.split()) == ["n1", "n2"], out
    assert os.uname().nodename not in ("n1", "n2")
