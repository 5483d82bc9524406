"""Local nodes share one machine: the time a payload waits for a CPU is not node time.

The contention is real and made certain: the test pins itself, the payload and two busy processes to one
CPU, so the payload gets about a third of it, and Linux's run-queue delay for it is most of its wall time.
The correction sits behind one seam, the node clock that the agent chooses once at start-up
(workers.supervision.node_clock): the shared machine's clock lives in upwell/local/, and a node of its own
gets a wall clock that watches nothing and never loads upwell/local.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from upwell.ledger import JobRow, ShardRow
from upwell.local.cpuwait import PayloadWait, RunQueueClock
from upwell.messages import WorkItem
from upwell.settings import Settings
from workers import results
from workers.agent_config import SHARED_MACHINE, AgentConfig
from workers.launch import run_payload
from workers.supervision import WallClock, node_clock

HOG = "import time\nend = time.monotonic() + 60\nwhile time.monotonic() < end: pass"


@contextmanager
def one_cpu_with_hogs(hogs: int):
    """This process and its children on one CPU, with ``hogs`` busy loops beside them."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    # Each in a session of its own, as the payload is (workers.payload_process): with the kernel's autogroup
    # scheduling on (sched_autogroup_enabled, the default of most distributions), CFS shares a CPU between
    # sessions first, so hogs in this one session would leave the payload half of it, not a third.
    procs = [subprocess.Popen([sys.executable, "-c", HOG], start_new_session=True) for _ in range(hogs)]
    try:
        _spinning(procs)
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(5)
        os.sched_setaffinity(0, before)


def _cpu_ticks(pid: int) -> int:
    """User + system clock ticks the process has run (/proc/<pid>/stat, fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _spinning(procs: list[subprocess.Popen], ticks: int = 20) -> None:
    """Wait until every busy loop is past its interpreter's start-up and spinning (``ticks`` of CPU each,
    0.2 s at 100 Hz), so the payload shares its CPU with all of them from its first step: on a loaded
    machine a loop still starting leaves the payload more than its third for a while."""
    deadline = time.monotonic() + 60
    while any(_cpu_ticks(p.pid) < ticks for p in procs):
        assert time.monotonic() < deadline, "the busy loops did not start within 60 s"
        time.sleep(0.02)


def busy_item() -> WorkItem:
    return WorkItem(job_id="job", shard_id="s1", payload="logistic", pool="cpu", attempt=1,
                    params={"steps": 1_000_000, "burn_in": 1_000_000})


def test_a_payload_sharing_its_cpu_with_two_busy_processes_waits_most_of_its_run(tmp_path):
    with one_cpu_with_hogs(2):
        result = run_payload(busy_item(), tmp_path / "shared", clock=node_clock(True))
    assert result.status == "succeeded"
    # A third of one CPU: it waits about two thirds of its run; allow for sampling and start-up.
    assert 0.4 * result.run_s < result.cpu_wait_s < result.run_s, (result.cpu_wait_s, result.run_s)
    with one_cpu_with_hogs(2):  # a node of its own: nothing sampled, nothing taken off
        alone = run_payload(busy_item(), tmp_path / "own", clock=node_clock(False))
    assert alone.status == "succeeded" and alone.cpu_wait_s == 0.0


def test_cpu_wait_reads_the_run_queue_delay_of_the_process_and_its_descendants():
    code = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {HOG.replace('60', '1.5')!r}])"
    with one_cpu_with_hogs(1):
        parent = subprocess.Popen([sys.executable, "-c", code])  # waits; its child (a "rank") is the busy one
        waits = PayloadWait(parent.pid)
        while parent.poll() is None:
            waits.sample(time.monotonic())
            time.sleep(0.1)
    assert len(waits.waited) >= 2, "the child was never read"
    assert waits.seconds > 0.4, waits.waited  # the busy child shared its CPU with one hog for 1.5 s


def test_the_result_document_takes_the_cpu_wait_off_node_time():
    item = busy_item()
    doc = results.document(item, "succeeded", shard=ShardRow(job_id="job", shard_id="s1"), job=JobRow(job_id="job"),
                           node={}, started="2026-12-01T00:00:00.000000Z", finished="2026-12-01T00:00:04.000000Z",
                           settings=Settings.from_env(), cpu_wait_s=1.5)
    assert doc["timings"]["node_seconds"] == pytest.approx(2.5) and doc["timings"]["cpu_wait_s"] == 1.5
    plain = results.document(item, "succeeded", shard=ShardRow(job_id="job", shard_id="s1"), job=JobRow(job_id="job"),
                             node={}, started="2026-12-01T00:00:00.000000Z", finished="2026-12-01T00:00:04.000000Z",
                             settings=Settings.from_env())
    assert plain["timings"]["node_seconds"] == pytest.approx(4.0)


def test_only_a_shared_machine_takes_cpu_wait_off(monkeypatch):
    monkeypatch.delenv(SHARED_MACHINE, raising=False)
    assert AgentConfig.from_env("cpu").shared_machine is False
    assert isinstance(node_clock(AgentConfig.from_env("cpu").shared_machine), WallClock)
    monkeypatch.setenv(SHARED_MACHINE, "1")
    assert AgentConfig.from_env("cpu").shared_machine is True
    assert isinstance(node_clock(AgentConfig.from_env("cpu").shared_machine), RunQueueClock)
    from upwell.local.stack import LocalStack

    assert LocalStack(env={}).env[SHARED_MACHINE] == "1"
    assert RunQueueClock().thread_waited() >= 0.0
    assert WallClock().thread_waited() == 0.0 and WallClock().watch(os.getpid()) is None


def test_a_node_of_its_own_never_loads_the_local_machinery():
    """The Azure path: an agent built without the shared-machine setting imports nothing of upwell/local."""
    script = textwrap.dedent(f"""
        import os, sys
        os.environ.pop({SHARED_MACHINE!r}, None)
        from upwell.settings import Settings
        from upwell.storage import Storage
        from workers.agent import Agent, AgentConfig
        conn = ("DefaultEndpointsProtocol=http;AccountName=a;AccountKey=a2V5;BlobEndpoint=http://127.0.0.1:1/a;"
                "QueueEndpoint=http://127.0.0.1:1/a;TableEndpoint=http://127.0.0.1:1/a;")
        agent = Agent(Storage(conn), AgentConfig.from_env("cpu"), Settings())
        print(type(agent.clock).__name__, sorted(m for m in sys.modules if m.startswith("upwell.local")))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["WallClock", "[]"], out.stdout + out.stderr


def test_ranks_and_threads_on_a_shared_machine_wait_without_spinning():
    """`upwell up`'s nodes run MPI ranks with yield-when-idle and OpenMP threads with a passive wait unless the user
    chose, and the pinned Open MPI and torch's OpenMP read those names from the environment (a renamed parameter
    would be ignored in silence)."""
    from upwell.local.stack import SHARED_MACHINE_WAITS, LocalStack
    from workers.launch import find_mpiexec

    yield_env, wait_env = "OMPI_MCA_mpi_yield_when_idle", "OMP_WAIT_POLICY"
    assert {k: LocalStack(env={}).env[k] for k in (yield_env, wait_env)} == {yield_env: "1", wait_env: "PASSIVE"}
    assert set(SHARED_MACHINE_WAITS) == {yield_env, wait_env}
    chosen = {yield_env: "0", wait_env: "ACTIVE"}
    assert {k: LocalStack(env=chosen).env[k] for k in chosen} == chosen
    info = str(Path(find_mpiexec()).with_name("ompi_info"))
    seen = {}
    for value in ("0", "1"):
        out = subprocess.run([info, "--parsable", "--param", "mpi", "all", "--level", "9"], capture_output=True,
                             text=True, timeout=60, check=True, env={**os.environ, yield_env: value}).stdout
        seen[value] = {k: v for k, _, v in (line.rpartition(":") for line in out.splitlines())
                       if k.startswith("mca:mpi:base:param:mpi_yield_when_idle:") and k.endswith((":value", ":source"))}
    assert seen["1"] == {"mca:mpi:base:param:mpi_yield_when_idle:value": "true",
                         "mca:mpi:base:param:mpi_yield_when_idle:source": "environment"}, seen
    assert seen["0"]["mca:mpi:base:param:mpi_yield_when_idle:value"] == "false", seen
    # libgomp, bundled with torch, prints the settings it runs with when asked (OMP_DISPLAY_ENV).
    use_threads = "import torch; torch.set_num_threads(2); torch.ones(64, 64).sum()"
    for policy in ("PASSIVE", "ACTIVE"):
        done = subprocess.run([sys.executable, "-c", use_threads],
                              capture_output=True, text=True, timeout=120, check=True,
                              env={**os.environ, wait_env: policy, "OMP_DISPLAY_ENV": "true"})
        assert f"OMP_WAIT_POLICY = '{policy}'" in done.stdout + done.stderr, done.stdout + done.stderr
