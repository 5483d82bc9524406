"""The launcher: statuses from exit codes, stop forwarding, ticks, timeouts, tails, commands and the CLI.

The processes are real: the ``logistic`` payload, whose ``sleep_s`` and
``fail_first_attempts`` parameters exist for exactly this.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import pytest
from typer.testing import CliRunner

from upwell.cli import app
from upwell.errors import InputRejected
from upwell.messages import WorkItem
from upwell.payloads import builtin as registry
from workers import launch
from workers import payload_process as process
from workers.launch import build_command, run_payload


def logistic(attempt: int = 1, **params) -> WorkItem:
    return WorkItem(job_id="job", shard_id="s1", payload="logistic", pool="cpu", params=params, attempt=attempt)


def test_success_writes_item_json_and_returns_metrics(tmp_path):
    result = run_payload(logistic(r=3.2), tmp_path)
    assert result.status == "succeeded" and result.exit_code == 0
    assert result.metrics["period"] == 2 and result.artifacts == []
    assert result.checkpoints == 0 and result.resumed_from is None and result.run_s > 0
    item = json.loads((tmp_path / "item.json").read_text())
    assert item["params"]["r"] == 3.2 and item["params"]["steps"] == 2000  # validated, defaults filled
    assert item["attempt"] == 1 and item["ranks"] == 1 and item["input_path"] is None
    # a silent payload: its log holds only upwell's command line, which is not output, so none is kept
    lines = (tmp_path / "payload.log").read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("$ ") and "logistic" in lines[0], lines
    assert result.log_bytes == 0


def test_failure_keeps_the_stderr_tail_and_the_next_attempt_succeeds(tmp_path):
    failed = run_payload(logistic(attempt=1, fail_first_attempts=1), tmp_path / "a1")
    assert failed.status == "failed" and failed.exit_code == 1 and not failed.permanent
    log = (tmp_path / "a1" / "payload.log").read_bytes()
    assert b"injected failure" in log and 0 < failed.log_bytes == len(log) - len(log.split(b"\n", 1)[0]) - 1
    assert "injected failure: attempt 1" in failed.stderr_tail and failed.metrics == {}
    assert run_payload(logistic(attempt=2, fail_first_attempts=1), tmp_path / "a2").status == "succeeded"


def test_stop_forwards_sigterm_and_exit_75_is_preempted(tmp_path):
    stop = threading.Event()
    threading.Timer(1.0, stop.set).start()
    started = time.monotonic()
    result = run_payload(logistic(sleep_s=60), tmp_path, stop=stop)
    assert result.status == "preempted" and result.exit_code == 75
    assert time.monotonic() - started < 10


def test_on_tick_runs_while_the_payload_runs_and_its_errors_do_not_kill_it(tmp_path):
    ticks = []

    def tick() -> None:
        ticks.append(time.monotonic())
        raise RuntimeError("lease lost")

    result = run_payload(logistic(sleep_s=1.5), tmp_path, on_tick=tick, tick_s=0.2)
    assert result.status == "succeeded" and len(ticks) >= 4


def test_timeout_stops_the_payload_and_fails_it(tmp_path):
    # 3 s: long enough for the payload to install its SIGTERM handler on a loaded machine (at 0.5 s the signal
    # could land during its imports, and it died of it: -15, not the 75 of a payload that stops on SIGTERM)
    result = run_payload(logistic(sleep_s=60), tmp_path, timeout_s=3)
    assert result.status == "failed" and result.timed_out and result.exit_code == 75


def test_stop_set_before_start_runs_nothing(tmp_path):
    stop = threading.Event()
    stop.set()
    result = run_payload(logistic(), tmp_path, stop=stop)
    assert result.status == "preempted" and result.exit_code is None and result.metrics == {}


def test_bad_parameters_and_missing_input_are_permanent_input_errors(tmp_path):
    with pytest.raises(InputRejected) as bad:
        run_payload(logistic(r=9), tmp_path)
    assert bad.value.field == "params.r"
    with pytest.raises(InputRejected):
        run_payload(WorkItem(job_id="j", shard_id="s", payload="welch", pool="cpu"), tmp_path)
    with pytest.raises(InputRejected):
        run_payload(WorkItem(job_id="j", shard_id="s", payload="nope", pool="cpu"), tmp_path)


def test_resume_dir_is_copied_into_ckpt_and_reported(tmp_path):
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "progress.json").write_text(json.dumps({"marker": 42, "count": 3}))
    (saved / "state.bin").write_bytes(b"state")
    result = run_payload(logistic(), tmp_path / "w", resume_dir=saved)
    assert result.resumed_from == 42 and result.checkpoints == 0
    assert (result.checkpoint_dir / "state.bin").read_bytes() == b"state"


def test_stderr_tail_keeps_the_last_4_kib(tmp_path):
    code = "import sys; [print(f'line {i:05d}', file=sys.stderr) for i in range(3000)]"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    streams = process.Streams(proc, tmp_path / "log")
    proc.wait()
    streams.join()
    tail = streams.tail()
    assert len(tail.encode()) <= process.TAIL_BYTES and tail.endswith("line 02999\n")
    assert (tmp_path / "log").read_text().count("\n") == 3000


def test_commands_follow_the_launcher():
    item = WorkItem(job_id="j", shard_id="s", payload="heat-mpi", pool="mpi", ranks=4)
    mpi = build_command(registry.get("heat-mpi"), item, launch.Path("/w"))
    assert mpi[1:5] == ["-n", "4", "--bind-to", "none"] and mpi[0].endswith("mpiexec")  # never oversubscribed unasked
    allowed = build_command(registry.get("heat-mpi"), launch.dataclasses.replace(item, oversubscribe=True),
                            launch.Path("/w"))
    assert allowed[1:6] == ["-n", "4", "--oversubscribe", "--bind-to", "none"]
    assert mpi[5:] == [sys.executable, "-m", "workers.payloads.heat", "--workdir", "/w"]
    spec = registry.get("train-torch")
    two = build_command(spec, WorkItem(job_id="j", shard_id="s", payload="train-torch", pool="gpu", ranks=2),
                        launch.Path("/w"))
    assert two[:7] == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m"]
    one = build_command(spec, WorkItem(job_id="j", shard_id="s", payload="train-torch", pool="gpu"), launch.Path("/w"))
    assert one == [sys.executable, "-m", "workers.payloads.train", "--workdir", "/w"]


@pytest.mark.parametrize(("gpus", "ranks", "backend"),
                         [(0, 1, "gloo"), (0, 4, "gloo"), (1, 1, "nccl"), (1, 2, "gloo"), (4, 4, "nccl"),
                          (4, 8, "gloo")])
def test_train_ranks_get_nccl_only_with_a_gpu_each(gpus, ranks, backend):
    """nccl refuses two ranks on one GPU (bench/gpu_check.py saw it on an H200, NCCL 2.28.9): ranks beyond the node's
    GPUs share them over gloo; without a GPU, gloo on the CPU."""
    from workers.payloads.train import placement

    assert placement(gpus, ranks) == backend
    assert placement(gpus, ranks, mig=True) == "gloo"  # NCCL does not run on MIG instances


def test_train_ranks_shown_several_mig_instances_each_keep_one(monkeypatch):
    """A CUDA process uses one MIG instance however many it is shown: each local rank keeps its own, round robin,
    before CUDA starts, also where the shard's devices mix an instance and a whole GPU (a node with one GPU
    partitioned); whole GPUs only, and a single device, are left as the shard was given them."""
    from workers.payloads import train

    mig = "MIG-a686709d-6dc2-542a-8851-0d2508448c10,MIG-53864714-0a66-5df2-9007-9268e30d9a72"
    first, second = mig.split(",")
    assert [train.own_instance(mig, r) for r in range(3)] == [first, second, first]
    assert train.own_instance(first, 1) is None and train.own_instance("0,1", 1) is None
    assert train.own_instance("", 0) is None
    assert [train.own_instance(f"1,{first}", r) for r in range(2)] == ["1", first]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", mig)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.delenv("WORLD_SIZE", raising=False)  # one process here: no group to start
    train.Dist.start()
    assert train.os.environ["CUDA_VISIBLE_DEVICES"] == second


def test_cli_runs_a_payload_and_copies_its_outputs(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["payload", "run", "logistic", "--param", "r=3.9", "--param", "steps=500",
                                 "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["status"] == "succeeded" and doc["metrics"]["lyapunov"] > 0
    assert (tmp_path / "out" / "out" / "metrics.json").exists() and (tmp_path / "out" / "result.json").exists()
    bad = runner.invoke(app, ["payload", "run", "logistic", "--param", "r=9"])
    assert bad.exit_code == 2 and "r" in bad.output


def test_a_payload_that_ignores_the_stop_is_killed_with_its_detached_children(tmp_path):
    # like mpiexec's ranks: a grandchild in a session of its own, outside the process group
    code = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "g = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'], start_new_session=True); "
            "print(g.pid, flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    grandchild = int(proc.stdout.readline())
    stop = threading.Event()
    stop.set()
    started = time.monotonic()
    outcome = process.supervise(proc, stop=stop, on_tick=None, timeout_s=None, tick_s=1, grace_s=0.5,
                                stop_signal=signal.SIGTERM)
    assert time.monotonic() - started < 5 and outcome.signals == ["SIGTERM", "SIGKILL"]
    assert launch._status(proc.returncode, tmp_path, outcome) == "failed"
    proc.stdout.close()
    deadline = time.monotonic() + 5
    while not gone(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(grandchild)


def gone(pid: int) -> bool:
    """Dead: no /proc entry, or a zombie waiting for its (new) parent to reap it."""
    try:
        return (launch.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def test_payload_does_not_outlive_a_killed_agent(tmp_path):
    """SIGKILL the process that launched a payload: the payload is told (SIGTERM) and exits on its own."""
    import os
    import signal
    from pathlib import Path

    marker = tmp_path / "pid"
    script = f"""
import sys, time
from pathlib import Path
from upwell.messages import WorkItem
from workers.launch import run_payload
item = WorkItem(job_id="j", shard_id="s", payload="logistic", pool="cpu", params={{"sleep_s": 60, "steps": 100}})
import threading, os
def report():
    for _ in range(200):
        for p in Path("/proc").iterdir():
            try:
                argv = (p / "cmdline").read_bytes().split(b"\\0")
                if p.name.isdigit() and argv[1:3] == [b"-m", b"workers.payloads." + b"logistic"]:
                    Path({str(marker)!r}).write_text(p.name); return
            except OSError:
                pass
        time.sleep(0.1)
threading.Thread(target=report, daemon=True).start()
run_payload(item, Path({str(tmp_path / "w")!r}))
"""
    agent = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[2])
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.exists(), "the payload never started"
    payload_pid = int(marker.read_text())
    os.kill(agent.pid, signal.SIGKILL)
    agent.wait(10)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(payload_pid, 0)
            state = Path(f"/proc/{payload_pid}/stat").read_text().split(")")[-1].split()[0]
            if state == "Z":
                break
        except (ProcessLookupError, FileNotFoundError):
            break
        time.sleep(0.1)
    else:
        os.kill(payload_pid, signal.SIGKILL)
        raise AssertionError("the payload outlived its agent")


def test_a_stop_that_kills_the_payload_before_its_handler_is_a_preemption(tmp_path):
    """A spot eviction during start-up: the forwarded SIGTERM (SIGUSR1 for MPI) kills the payload before
    it installed its handler. The agent stopped it; it did not fail. Unasked, the same death is a failure."""
    from workers.launch import _status
    from workers.payload_process import Outcome as _Outcome

    for signum in (signal.SIGTERM, signal.SIGUSR1):
        assert _status(-signum, tmp_path, _Outcome(stopped=True)) == "preempted"
        assert _status(-signum, tmp_path, _Outcome()) == "failed"
    assert _status(-signal.SIGKILL, tmp_path, _Outcome(stopped=True)) == "failed"  # ignored the stop: killed
    assert _status(-signal.SIGTERM, tmp_path, _Outcome(stopped=False, timed_out=True)) == "failed"
