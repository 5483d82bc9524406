"""The warm runner (workers.forkserver): a forked child per shard gives what a fresh process gives.

Same metrics and artifacts, failures with their stderr, a stop request honoured (exit 75), a fresh process
per shard (its own pid and session), and no payload left running when the launcher's process dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from upwell.messages import WorkItem
from workers import warm
from workers.launch import run_payload


def item(**params) -> WorkItem:
    return WorkItem(job_id="job", shard_id="s", payload="logistic", pool="cpu",
                    params={"r": 3.3, "steps": 50, "burn_in": 10, **params})


@pytest.fixture
def warm_on(monkeypatch):
    monkeypatch.setenv("UPWELL_WARM_RUNNER", "1")
    yield warm.runner()


def test_forked_payload_gives_the_fresh_process_results(tmp_path, monkeypatch, warm_on):
    forked = run_payload(item(), tmp_path / "warm")
    monkeypatch.setenv("UPWELL_WARM_RUNNER", "0")
    fresh = run_payload(item(), tmp_path / "cold")
    assert forked.status == fresh.status == "succeeded"
    assert forked.metrics == fresh.metrics
    assert [p.name for p in forked.artifacts] == [p.name for p in fresh.artifacts]
    assert "$ " in (tmp_path / "warm" / "payload.log").read_text()
    assert forked.log_bytes == fresh.log_bytes == 0  # silent either way: only upwell's command line, no log kept


def test_each_shard_is_a_new_process_in_its_own_session(tmp_path, warm_on, monkeypatch):
    seen: list[tuple[int, int]] = []
    start = warm_on.start_payload

    def recording(*args, **kwargs):
        proc, streams = start(*args, **kwargs)
        seen.append((proc.pid, os.getsid(proc.pid)))
        return proc, streams

    monkeypatch.setattr(warm_on, "start_payload", recording)
    for k in range(3):
        assert run_payload(item(), tmp_path / f"w{k}").status == "succeeded"
    pids = [pid for pid, _ in seen]
    assert len(set(pids)) == 3 and warm_on.proc.pid not in pids
    assert all(sid == pid for pid, sid in seen)  # each child leads its own session (the launcher signals it)
    assert warm_on.alive()


def test_a_failure_keeps_its_stderr_tail(tmp_path, warm_on):
    result = run_payload(item(fail_first_attempts=1), tmp_path / "w")
    assert result.status == "failed" and result.exit_code == 1
    assert "injected failure: attempt 1" in result.stderr_tail
    assert "injected failure" in (tmp_path / "w" / "payload.log").read_text()
    assert result.log_bytes >= len("injected failure")  # stderr, appended at the end, is counted as output


def test_a_stop_request_preempts_the_forked_payload(tmp_path, warm_on):
    stop = threading.Event()
    threading.Timer(1.0, stop.set).start()
    started = time.monotonic()
    result = run_payload(item(sleep_s=60), tmp_path / "w", stop=stop, tick_s=0.1)
    assert result.status == "preempted" and result.exit_code == 75
    assert time.monotonic() - started < 20


def test_payload_dies_with_the_launcher_process(tmp_path):
    """SIGKILL the process that launched a forked payload: the runner, then the payload, follow it."""
    marker = tmp_path / "w"
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        os.environ["UPWELL_WARM_RUNNER"] = "1"
        from upwell.messages import WorkItem
        from workers.launch import run_payload
        run_payload(WorkItem(job_id="job", shard_id="s", payload="logistic", pool="cpu",
                             params={{"sleep_s": 120}}), {str(marker)!r})
    """)
    launcher = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.monotonic() + 60
    child = None
    while time.monotonic() < deadline and child is None:
        time.sleep(0.2)
        child = _payload_pid(marker)
    assert child is not None, "the forked payload never started"
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.2)
    assert not _alive(child), f"payload {child} outlived its launcher"


def _payload_pid(workdir: Path) -> int | None:
    """The forked payload: a process whose working directory is the shard's work dir."""
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if os.readlink(entry / "cwd") == str(workdir.resolve()):
                return int(entry.name)
        except OSError:
            continue
    return None


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
