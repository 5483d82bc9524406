"""The Slurm pool against a real Slurm: Debian's slurmctld and two slurmd (``slurmd -N``) on this
machine, auth/none, free ports, everything in a temp folder (upwell.local.slurm_cluster.LocalSlurm).

A missing Slurm FAILS these tests with how to install it (``make slurm``); they never skip.
Each test keeps its work tiny: the machine has two cores shared with other work.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pipeline_helpers import pipeline_env, running_host, wait_for, wait_reported
from tests.slurm_fixture import running_slurm
from upwell import names
from upwell.ingest.blobnames import job_id_for
from upwell.ingest.ingestor import Ingestor
from upwell.ledger import Ledger
from upwell.local.slurm_cluster import LocalSlurm
from upwell.pools import build_slurm, make_pool
from upwell.pools.base import NodeState, PoolSpec
from upwell.pools.slurm import FINISHED, SlurmPool
from upwell.settings import Settings
from upwell.storage import Storage

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurm]:
    """slurmctld + slurmd n1, n2 (2 CPUs each), foreground processes, stopped after the module."""
    with running_slurm(tmp_path_factory.mktemp("slurm"), nodes=("n1", "n2"), cpus=2) as cluster:
        yield cluster


@pytest.fixture
def store(azurite, monkeypatch, slurm) -> Storage:
    """Azurite, and the environment that sbatch hands to the agent jobs (SLURM_CONF, the storage)."""
    monkeypatch.setenv(names.CONNECTION, azurite.connection_string)
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT", "1")
    monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    s = Storage(azurite.connection_string)
    s.ensure()
    for pool in names.POOLS:
        s.queue(names.work_queue(pool)).clear_messages()
    yield s
    slurm.run("scancel", "--user=root", check=False)  # whatever a failed test left behind
    _wait(lambda: not slurm.run("squeue", "--noheader", check=False).strip(), 60, "the queue to empty")


def _wait(predicate, timeout: float, what: str, on_timeout=lambda: ""):
    return wait_for(predicate, timeout, what, on_timeout, poll_s=0.3)


def _pool(store: Storage, tmp_path: Path, name: str = "cpu", **options) -> SlurmPool:
    spec = PoolSpec(name, backend="slurm", max_nodes=2,
                    options={"state_dir": str(tmp_path / "state"), "idle_exit_s": 60,
                             "output": str(tmp_path / "job-%j.out"),
                             "env": {"UPWELL_SCRATCH": str(tmp_path / "scratch"), "UPWELL_LEASE_S": "20"},
                             **options})
    pool = make_pool(spec)
    assert isinstance(pool, SlurmPool)
    _EARLIER[id(pool)] = {j.job_id for j in pool.jobs()}
    return pool


_EARLIER: dict[int, set[str]] = {}  # per pool object: jobs Slurm still lists from earlier tests (MinJobAge)


def _ours(pool: SlurmPool) -> list:
    """The pool's jobs that this test submitted."""
    return [j for j in pool.jobs() if j.job_id not in _EARLIER[id(pool)]]


def _ingest(store: Storage, name: str, manifest: bytes) -> str:
    store.blob(names.INCOMING, name).upload_blob(manifest, overwrite=True)
    return Ingestor(store, Settings()).ingest(name).job_id


def _job_logs(tmp_path: Path) -> str:
    return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                     for p in sorted(tmp_path.glob("job-*.out")))


def test_sample_job_runs_through_the_slurm_pool_to_a_report(store, slurm, azurite, tmp_path, monkeypatch):
    pools = {"cpu": {"backend": "slurm", "max_nodes": 2, "scale_down_votes": 1, "cooldown_s": 1.0,
                     "price_key": "Standard_D2s_v5",
                     "options": {"idle_exit_s": 20, "output": str(tmp_path / "job-%j.out")}}}
    pipeline_env(monkeypatch, azurite.connection_string, tmp_path / "state", UPWELL_POOLS=json.dumps(pools))
    manifest = (REPO / "samples" / "sweep" / "job.yaml").read_bytes()
    with running_host(azurite.connection_string, tmp_path / "state"):
        etag = store.blob(names.INCOMING, "slurm/sweep/job.yaml").upload_blob(manifest, overwrite=True)["etag"]
        job_id = job_id_for("slurm/sweep/job.yaml", etag)
        try:
            job = wait_reported(store, job_id, 240)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{_job_logs(tmp_path)}\n{slurm.logs()}") from None
    assert job.status == "succeeded", job
    summary = json.loads(store.read(f"reports/{job_id}/summary.json"))
    assert summary["counts"]["succeeded"] == 12, summary["counts"]
    nodes = {json.loads(store.read(f"results/{job_id}/s{i:05d}.json"))["node"]["id"] for i in range(12)}
    assert nodes and all(n.startswith("slurm-cpu-") for n in nodes), nodes  # agents ran as Slurm jobs


def test_scale_to_zero_cancels_idle_agents_and_never_a_running_one(store, slurm, tmp_path):
    job_id = _ingest(store, "slurm/slow/job.yaml", b"payload: logistic\npool: cpu\n"
                     b"params: {steps: 200, burn_in: 50, sleep_s: 12}\ngrid: {r: [3.3]}\n")
    ledger = Ledger(store)
    pool = _pool(store, tmp_path, cpus_per_task=2)  # one agent fills a node: two run, the third waits
    pool.scale_to(3)
    def settled():  # both started agents have said what they do (no file yet reads as busy), the shard runs
        s = pool.status()
        said = {p.stem for p in (tmp_path / "state" / "cpu").glob("*.json")}
        up = [n.rsplit("-", 1)[1] for n, st in s.nodes.items() if st in (NodeState.RUNNING, NodeState.IDLE)]
        return (s.count(NodeState.RUNNING) == 1 and s.idle == 1 and s.count(NodeState.PENDING) == 1
                and set(up) <= said and getattr(ledger.shard(job_id, "s00000"), "status", None) == "running" and s)

    status = _wait(settled, 90, "one busy, one idle, one pending agent",
                   lambda: f"{pool.status()}\n{_job_logs(tmp_path)}")
    busy_node = ledger.shard(job_id, "s00000").node
    busy_job = busy_node.rsplit("-", 1)[1]
    idle_job = next(n.rsplit("-", 1)[1] for n, st in status.nodes.items() if st is NodeState.IDLE)
    assert status.nodes[busy_node] is NodeState.RUNNING and idle_job != busy_job

    pool.scale_to(0)
    after = pool.status()
    assert after.nodes[busy_node] is NodeState.RUNNING
    assert after.alive == 1, after
    squeue = {j.job_id: j.state for j in pool.jobs()}
    assert squeue[busy_job] == "RUNNING"
    # The pending job is cancelled and the idle agent drains; the busy one is left alone.
    _wait(lambda: [j.job_id for j in _ours(pool) if j.state not in FINISHED] == [busy_job], 60,
          "the idle and pending jobs to go", lambda: str(pool.jobs()))
    ended = {j.job_id: j.state for j in pool.jobs()}
    pending_job = next(n.rsplit("-", 1)[1] for n, st in status.nodes.items() if st is NodeState.PENDING)
    assert ended[pending_job] == "CANCELLED" and ended[idle_job] == "COMPLETED", ended  # drained, not killed
    assert ended[busy_job] == "RUNNING"

    result = _wait(lambda: store.exists(f"results/{job_id}/s00000.json")
                   and json.loads(store.read(f"results/{job_id}/s00000.json")), 120, "the busy shard's result",
                   lambda: _job_logs(tmp_path))
    assert result["status"] == "succeeded" and result["node"]["id"] == busy_node
    shard = ledger.shard(job_id, "s00000")
    assert not shard.preemptions and not shard.failures and shard.attempts == 1
    pool.scale_to(0)  # now idle: it drains too, and the pool is empty
    assert pool.status().alive == 0
    _wait(lambda: all(j.state in FINISHED for j in _ours(pool)), 60, "the last agent to drain",
          lambda: str(pool.jobs()))
    assert {j.job_id: j.state for j in pool.jobs()}[busy_job] == "COMPLETED"


def test_the_spot_share_runs_in_the_spot_partition(store, slurm, tmp_path):
    """The spot share of the agents goes to the spot partition (on Azure a CycleCloud spot nodearray; here
    the local cluster's ``spot``): squeue lists each agent in its partition, the pool counts them back, and
    every shard's result says whether the agent that ran it was on spot, as its partition does."""
    pool = _pool(store, tmp_path, partition="upwell", spot_partition="spot")
    pool.scale_to(2, spot=1)
    _wait(lambda: len(_ours(pool)) == 2, 30, "two agent jobs", lambda: str(pool.jobs()))
    partition_of = {j.job_id: j.partition for j in _ours(pool)}
    listed = slurm.run("squeue", "--noheader", "--format=%i %P", f"--jobs={','.join(partition_of)}")
    assert sorted(line.split()[1] for line in listed.splitlines() if line.strip()) == ["spot", "upwell"], listed
    status = pool.status()
    assert (status.spot, status.dedicated) == (1, 1), status

    job_id = _ingest(store, "slurm/spot/job.yaml", b"payload: logistic\npool: cpu\n"
                     b"params: {steps: 20, burn_in: 5}\ngrid: {r: [3.1, 3.2, 3.3, 3.4]}\n")
    blobs = [f"results/{job_id}/s{i:05d}.json" for i in range(4)]
    _wait(lambda: all(store.exists(b) for b in blobs), 180, "the four results", lambda: _job_logs(tmp_path))
    spot_of = {build_slurm.node_id("cpu", j): p == "spot" for j, p in partition_of.items()}
    for blob in blobs:
        node = json.loads(store.read(blob))["node"]
        assert node["id"] in spot_of and node["spot"] is spot_of[node["id"]], (node, spot_of)
    pool.scale_to(0)


def test_scancel_signal_term_checkpoints_then_the_next_agent_resumes(store, slurm, tmp_path):
    job_id = _ingest(store, "slurm/heat/job.yaml", b"payload: heat-mpi\npool: mpi\nresources: {ranks: 1}\n"
                     b"params: {nx: 128, t_end: 0.2, checkpoint_every: 100}\ngrid: {alpha: [1.0]}\n")
    ledger = Ledger(store)
    pool = _pool(store, tmp_path, name="mpi", cpus_per_task=2)
    pool.scale_to(1)
    _wait(lambda: list((tmp_path / "scratch").glob("upwell-*/work/ckpt/progress.json")), 180,
          "the payload's first checkpoint", lambda: _job_logs(tmp_path))
    (slurm_job,) = [j.job_id for j in _ours(pool) if j.state == "RUNNING"]
    slurm.run("scancel", "--signal=TERM", slurm_job)  # Slurm signals the job's steps: the agent
    _wait(lambda: getattr(ledger.shard(job_id, "s00000"), "status", None) == "preempted", 60,
          "the preemption", lambda: _job_logs(tmp_path))
    assert list(store.list(names.CHECKPOINTS, f"{job_id}/s00000/")), "no checkpoint was uploaded"
    _wait(lambda: pool.status().alive == 0, 60, "the preempted agent to exit", lambda: _job_logs(tmp_path))
    logs = _job_logs(tmp_path)
    assert "agent.preempted" in logs
    # The ranks checkpointed and exited 75: Slurm's SIGTERM to mpiexec itself did not tear them down.
    assert "agent.stopped_payload_died" not in logs, logs

    pool.scale_to(1)
    result = _wait(lambda: store.exists(f"results/{job_id}/s00000.json")
                   and json.loads(store.read(f"results/{job_id}/s00000.json")), 240, "the resumed result",
                   lambda: _job_logs(tmp_path))
    assert result["status"] == "succeeded", result.get("error")
    assert result["metrics"]["resumed_from_step"] > 0 and result["timings"]["preemptions"] == 1
    assert result["metrics"]["l2_error"] < 1e-4
    assert result["metrics"]["ranks"] == 2  # the allocation's CPUs, not the manifest's one rank
    shard = ledger.shard(job_id, "s00000")
    assert shard.preemptions == 1 and not shard.failures
    pool.scale_to(0)


def test_a_node_set_down_mid_run_loses_no_shard(store, slurm, tmp_path):
    grid = b"[3.1, 3.3, 3.5, 3.7]"
    job_id = _ingest(store, "slurm/down/job.yaml", b"payload: logistic\npool: cpu\n"
                     b"params: {steps: 200, burn_in: 50, sleep_s: 10}\ngrid: {r: " + grid + b"}\n")
    ledger = Ledger(store)
    pool = _pool(store, tmp_path, cpus_per_task=2)  # one agent per node
    pool.scale_to(2)
    def in_flight() -> list:  # this job's shards that run now (no collect here: skip finished ones)
        return [x for x in ledger.running("cpu") if x.job_id == job_id and x.node
                and not store.exists(f"results/{job_id}/{x.shard_id}.json")]

    running = _wait(lambda: len(r := in_flight()) == 2 and r, 120, "a shard running on each node",
                    lambda: f"{pool.status()}\n{_job_logs(tmp_path)}")
    victim = {j.job_id: j.nodes for j in pool.jobs()}[running[0].node.rsplit("-", 1)[1]]
    slurm.run("scontrol", "update", f"nodename={victim}", "state=down", "reason=upwell-test")
    try:
        seen: set[NodeState] = set()
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:  # the scaler's loop: keep two agents asked for
            status = pool.status()
            seen |= {st for n, st in status.nodes.items() if n.rsplit("-", 1)[1] not in _EARLIER[id(pool)]}
            if len([r for r in store.list(names.RESULTS, f"{job_id}/") if r.name.count("/") == 1]) == 4:
                break
            if slurm.node_states().get(victim, "").startswith("down") and NodeState.FAILED in seen:
                # (ReturnToService=2 may bring it back first: then resume is refused, which is fine)
                slurm.run("scontrol", "update", f"nodename={victim}", "state=resume", check=False)
            pool.scale_to(2)
            time.sleep(1)
    finally:
        slurm.run("scontrol", "update", f"nodename={victim}", "state=resume", check=False)
    results = [json.loads(store.read(f"results/{job_id}/s{i:05d}.json")) for i in range(4)]
    assert [r["status"] for r in results] == ["succeeded"] * 4, [r.get("error") for r in results]
    assert NodeState.FAILED in seen, seen  # the killed agent's job showed as NODE_FAIL
    poisoned = store.queue(names.poison_queue(names.work_queue("cpu"))).peek_messages(max_messages=32)
    assert not [m for m in poisoned if job_id in m.content]  # the queue is shared with other tests' jobs
    assert sorted(r["metrics"]["r"] for r in results) == [3.1, 3.3, 3.5, 3.7]
    pool.scale_to(0)


def test_the_pool_through_slurmrestd(store, slurm, tmp_path):
    """The same pool with options.slurmrestd: a real slurmrestd (local auth, unix socket) submits, lists
    and drains the agents; #SBATCH lines are not read there, so the job's fields must carry them."""
    url = slurm.start_rest()
    job_id = _ingest(store, "slurm/rest/job.yaml", b"payload: logistic\npool: cpu\n"
                     b"params: {steps: 200, burn_in: 50, sleep_s: 1}\ngrid: {r: [3.2, 3.6]}\n")
    pool = _pool(store, tmp_path, slurmrestd=url, cpus_per_task=2)
    pool.scale_to(2)
    jobs = _ours(pool)
    assert len(jobs) == 2 and {j.state for j in jobs} <= {"PENDING", "CONFIGURING", "RUNNING"}, jobs
    shown = slurm.run("scontrol", "show", "job", jobs[0].job_id)
    assert "JobName=upwell-cpu" in shown and "Comment=upwell-pool=cpu" in shown and "CPUs/Task=2" in shown
    _wait(lambda: all(store.exists(f"results/{job_id}/s{i:05d}.json") for i in range(2)), 120,
          "both shards' results", lambda: f"{pool.jobs()}\n{_job_logs(tmp_path)}")
    results = [json.loads(store.read(f"results/{job_id}/s{i:05d}.json")) for i in range(2)]
    assert [r["status"] for r in results] == ["succeeded"] * 2
    assert {r["node"]["id"] for r in results} <= {f"slurm-cpu-{j.job_id}" for j in jobs}
    _wait(lambda: pool.status().idle == 2, 60, "both agents idle", lambda: str(pool.status()))
    pool.scale_to(0)
    _wait(lambda: all(j.state in FINISHED for j in _ours(pool)), 60, "the agents to drain", lambda: str(pool.jobs()))
    ended = {j.state for j in _ours(pool)}
    assert ended == {"COMPLETED"}, pool.jobs()  # drained through REST, not killed


def test_slurm_preemption_reaches_the_agent_which_checkpoints(store, slurm, tmp_path):
    """A job in the higher-tier partition preempts the agent (PreemptMode=CANCEL, GraceTime): Slurm's
    SIGTERM reaches the agent and the ranks, the shard checkpoints, and the next agent resumes."""
    job_id = _ingest(store, "slurm/preempt/job.yaml", b"payload: heat-mpi\npool: mpi\nresources: {ranks: 2}\n"
                     b"params: {nx: 256, t_end: 0.2, checkpoint_every: 100}\ngrid: {alpha: [0.5]}\n")
    ledger = Ledger(store)
    pool = _pool(store, tmp_path, name="mpi", cpus_per_task=2)
    pool.scale_to(1)
    _wait(lambda: list((tmp_path / "scratch").glob("upwell-*/work/ckpt/progress.json")), 180,
          "the payload's first checkpoint", lambda: _job_logs(tmp_path))
    # Every CPU of both nodes, in the partition that preempts ours.
    urgent = slurm.run("sbatch", "--parsable", "--partition=urgent", "--nodes=2", "--ntasks=2",
                       "--cpus-per-task=2", f"--output={tmp_path}/urgent-%j.out", "--wrap=sleep 1").strip()
    _wait(lambda: getattr(ledger.shard(job_id, "s00000"), "status", None) == "preempted", 60,
          "the preemption", lambda: f"{pool.jobs()}\n{_job_logs(tmp_path)}")
    # The agent checkpointed and exited 0 inside GraceTime, so Slurm records COMPLETED, not PREEMPTED
    # (that state is left for a job the grace ran out on); the ledger holds the preemption.
    _wait(lambda: all(j.state in FINISHED for j in _ours(pool)), 60, "the preempted agent to leave",
          lambda: str(pool.jobs()))
    assert {j.state for j in _ours(pool)} == {"COMPLETED"}, pool.jobs()
    logs = _job_logs(tmp_path)
    assert "agent.preempted" in logs and "agent.stopped_payload_died" not in logs, logs
    assert list(store.list(names.CHECKPOINTS, f"{job_id}/s00000/")), "no checkpoint was uploaded"
    _wait(lambda: "COMPLETED" in slurm.run("scontrol", "show", "job", urgent.split(";")[0], check=False)
          or not slurm.run("squeue", "--noheader", f"--jobs={urgent}", check=False).strip(), 60, "the urgent job")

    pool.scale_to(1)
    result = _wait(lambda: store.exists(f"results/{job_id}/s00000.json")
                   and json.loads(store.read(f"results/{job_id}/s00000.json")), 240, "the resumed result",
                   lambda: _job_logs(tmp_path))
    assert result["status"] == "succeeded", result.get("error")
    assert result["metrics"]["resumed_from_step"] > 0 and result["timings"]["preemptions"] == 1
    shard = ledger.shard(job_id, "s00000")
    assert shard.preemptions == 1 and not shard.failures
    pool.scale_to(0)
