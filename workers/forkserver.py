"""A warm runner for Python payloads: a parent that has imported the science stack once and forks a fresh
child per shard, so a shard skips the interpreter start and imports (about 150 ms, more under load) and
still runs in a process of its own, as a container would.

Protocol, one JSON object per line: the launcher writes ``{"module", "argv", "cwd", "env", "stdout",
"stderr"}`` to the server's stdin; the server forks and answers ``{"pid": n}`` (or ``{"error": text}``),
and later ``{"exit": n, "code": c, "cpu_s": s, "max_rss_mb": m}`` when that child ends (``c`` as
``Popen.returncode``: negative for a signal; its CPU seconds and peak RSS from wait4). The child starts a
session of its own (the launcher signals its group), dies with the server (PR_SET_PDEATHSIG), and the
server dies with the agent that started it, so no payload outlives its agent.

    python -m workers.forkserver   (started by workers.launch.WarmRunner)
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import traceback

from workers.payloads import PRELOAD


def die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _child(req: dict, started: int) -> None:
    """In the forked child: become the payload (never returns). ``started`` is told once the session is set."""
    code = 1
    try:
        os.setsid()
        os.write(started, b"1")
        os.close(started)
        die_with_parent()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
            out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(out, fd)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        import runpy
        import warnings

        # runpy warns that a preloaded module (PRELOAD) is already in sys.modules; a fresh process never says
        # it, and it would make every forked payload's log non-empty, so a silent payload would keep a log
        warnings.filterwarnings("ignore", message=r".*found in sys\.modules after import of package",
                                category=RuntimeWarning)
        sys.argv = [req["module"], *req["argv"]]
        try:
            runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - report it as a crashed payload would
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _reply(obj: dict) -> None:
    sys.__stdout__.write(json.dumps(obj) + "\n")
    sys.__stdout__.flush()


def _reap(children: set[int]) -> None:
    while children:
        try:
            pid, status, ru = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        # wait4's usage: the child's CPU seconds and peak RSS (KiB), as workers.procs.Usage reads them
        _reply({"exit": pid, "code": -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status),
                "cpu_s": round(ru.ru_utime + ru.ru_stime, 3), "max_rss_mb": round(ru.ru_maxrss / 1024, 1)})


def serve() -> None:
    die_with_parent()
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    _reply({"ready": os.getpid()})
    children: set[int] = set()
    buf = b""
    while True:
        ready, _, _ = select.select([0], [], [], 0.02)
        _reap(children)
        if not ready:
            continue
        data = os.read(0, 65536)
        if not data:  # the launcher went away
            return
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            try:
                req = json.loads(line)
                started, tell = os.pipe()
                pid = os.fork()
            except Exception as exc:  # noqa: BLE001 - a bad request or a failed fork is answered, not fatal
                _reply({"error": f"{type(exc).__name__}: {exc}"})
                continue
            if pid == 0:
                os.close(started)
                _child(req, tell)
            os.close(tell)
            os.read(started, 1)  # the child leads its own session before the launcher may signal the group
            os.close(started)
            children.add(pid)
            _reply({"pid": pid})


if __name__ == "__main__":
    serve()
