"""The launcher's side of the warm runner (workers.forkserver): start it once, ask it for a child per shard.

``WarmRunner.start_payload`` returns a ``WarmProcess`` with the part of ``subprocess.Popen`` the launcher
uses (``pid``, ``poll``, ``wait``, ``returncode``), and ``WarmStreams``, which gives payload.log both
streams and keeps the tail of stderr, as the launcher's pipes do. Used for the ``python`` launcher when
UPWELL_WARM_RUNNER is set (upwell up sets it); mpiexec and torchrun payloads start as before.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from workers.procs import REPO_ROOT, Usage, die_with_parent

TAIL_BYTES = 4096


class WarmRunner:
    """One forkserver process, a reader thread for its replies, and the exit codes it reported."""

    def __init__(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        self.proc = subprocess.Popen([sys.executable, "-m", "workers.forkserver"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                                     preexec_fn=die_with_parent)
        self.lock = threading.Lock()  # one request at a time
        self.cond = threading.Condition()
        self.replies: list[dict] = []
        self.exits: dict[int, int] = {}
        self.usage: dict[int, Usage] = {}  # what each child used, as the forkserver reaped it
        ready = json.loads(self.proc.stdout.readline() or b"{}")
        if "ready" not in ready:
            raise RuntimeError("the warm runner did not start")
        threading.Thread(target=self._read, daemon=True, name="warm-runner").start()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _read(self) -> None:
        for line in iter(self.proc.stdout.readline, b""):
            msg = json.loads(line)
            with self.cond:
                if "exit" in msg:
                    self.exits[msg["exit"]] = msg["code"]
                    if "cpu_s" in msg:
                        self.usage[msg["exit"]] = Usage(float(msg["cpu_s"]), float(msg["max_rss_mb"]))
                else:
                    self.replies.append(msg)
                self.cond.notify_all()
        with self.cond:  # the server is gone: its children died with it (PDEATHSIG)
            self.replies.append({"error": "the warm runner exited"})
            self.cond.notify_all()

    def start_payload(self, module: str, argv: list[str], cwd: Path, env: dict[str, str],
                      log_path: Path) -> tuple[WarmProcess, WarmStreams]:
        stderr = Path(cwd) / "payload.stderr"
        stderr.unlink(missing_ok=True)
        req = {"module": module, "argv": argv, "cwd": str(cwd), "env": env, "stdout": str(log_path),
               "stderr": str(stderr)}
        with self.lock:
            with self.cond:
                self.replies.clear()
            self.proc.stdin.write(json.dumps(req).encode() + b"\n")
            self.proc.stdin.flush()
            with self.cond:
                self.cond.wait_for(lambda: self.replies, timeout=30)
                reply = self.replies.pop(0) if self.replies else {"error": "no answer in 30 s"}
        if "pid" not in reply:
            raise OSError(f"warm runner: {reply.get('error')}")
        return WarmProcess(self, reply["pid"]), WarmStreams(stderr, log_path)

    def code(self, pid: int, timeout: float | None) -> int | None:
        with self.cond:
            self.cond.wait_for(lambda: pid in self.exits or not self.alive(), timeout=timeout)
            if pid in self.exits:
                return self.exits.pop(pid)
            return None if self.alive() else -9


class WarmProcess:
    """A forked payload, seen as the launcher sees a Popen."""

    def __init__(self, runner: WarmRunner, pid: int) -> None:
        self.runner, self.pid, self.returncode = runner, pid, None

    @property
    def usage(self) -> Usage | None:
        """Its CPU seconds and peak RSS once it ended (the forkserver reaps it with wait4)."""
        with self.runner.cond:
            return self.runner.usage.pop(self.pid, None) if self.returncode is not None else None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.runner.code(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.runner.code(self.pid, timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
        return self.returncode


class WarmStreams:
    """stdout went straight to payload.log; stderr to payload.stderr, appended to the log at the end."""

    def __init__(self, stderr: Path, log_path: Path) -> None:
        self.stderr, self.log_path, self._tail = stderr, log_path, b""

    def join(self) -> None:
        try:
            data = self.stderr.read_bytes()
        except OSError:
            return
        with open(self.log_path, "ab") as log:
            log.write(data)
        self._tail = data[-TAIL_BYTES:]
        self.stderr.unlink(missing_ok=True)

    def tail(self) -> str:
        return self._tail.decode(errors="replace")


_RUNNER: WarmRunner | None = None
_GUARD = threading.Lock()


def runner() -> WarmRunner:
    """The process's warm runner, started on first use and again if it died."""
    global _RUNNER
    with _GUARD:
        if _RUNNER is None or not _RUNNER.alive():
            _RUNNER = WarmRunner()
        return _RUNNER


def enabled() -> bool:
    return os.environ.get("UPWELL_WARM_RUNNER", "").strip().lower() in ("1", "true", "yes", "on")
