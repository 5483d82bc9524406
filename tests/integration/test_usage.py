"""The agent's measure of a payload: CPU seconds and peak RSS from wait4, for a process of its own and for
one the warm runner forked (issue 25 item 18)."""

from __future__ import annotations

import signal
import sys

from workers import payload_process

BURN = ("import time; x = bytearray({mib} * 1024 * 1024); x[::4096] = b'1' * len(x[::4096]); t = time.process_time()\n"
        "while time.process_time() - t < {cpu}: pass")


def _run(tmp_path, command: list[str], *, warm: bool = False):
    proc, streams = payload_process.start(command, tmp_path, {"PATH": "/usr/bin:/bin"}, warm_ok=warm)
    outcome = payload_process.supervise(proc, stop=None, on_tick=None, timeout_s=60, tick_s=5, grace_s=1,
                                        stop_signal=signal.SIGTERM)
    streams.join()
    return proc, outcome


def test_a_payload_process_is_measured_when_it_is_reaped(tmp_path):
    proc, outcome = _run(tmp_path, [sys.executable, "-c", BURN.format(mib=120, cpu=0.4)])
    assert proc.returncode == 0
    assert 0.35 <= outcome.cpu_s < 5, outcome
    assert 120 <= outcome.max_rss_mb < 1024, outcome


def test_a_child_that_a_signal_ends_keeps_its_exit_code_and_usage(tmp_path):
    proc, outcome = _run(tmp_path, [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    assert proc.returncode == -signal.SIGKILL and outcome.cpu_s is not None and outcome.max_rss_mb > 1


def test_a_warm_forked_payload_is_measured_by_the_forkserver(tmp_path, monkeypatch):
    monkeypatch.setenv("UPWELL_WARM_RUNNER", "1")
    proc, outcome = _run(tmp_path, [sys.executable, "-m", "this"], warm=True)
    assert type(proc).__name__ == "WarmProcess" and proc.returncode == 0
    assert outcome.cpu_s is not None and outcome.cpu_s >= 0 and outcome.max_rss_mb > 1, outcome
    assert "Zen of Python" in (tmp_path / "payload.log").read_text()
