"""The node's processes as Linux sees them: a child that dies with its parent, a process group
signalled with its strays, and a process's descendants read from /proc.

The bottom of the launcher's stack: ``workers.payload_process`` (one payload process) and ``workers.warm``
(the forkserver) both start children through these, and this module imports nothing of ``workers``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def die_with_parent() -> None:
    """In the child: have Linux send SIGTERM when the agent dies (even by SIGKILL), so a payload never
    outlives its agent and runs beside the retry of its own shard. Elsewhere this does nothing."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def shield_mpiexec(launcher: str) -> bool:
    """Inside a Slurm job, Slurm signals every process of the step (scancel, preemption, a node taken
    away), mpiexec included, and mpiexec kills its ranks within a second of SIGTERM: before they can
    checkpoint. So there mpiexec starts with SIGTERM blocked; the ranks (Open MPI unblocks signals in
    them) still get Slurm's SIGTERM, checkpoint and exit 75; SIGKILL after KillWait still ends all."""
    return launcher == "mpi" and bool(os.environ.get("SLURM_JOB_ID"))


def shielded_child() -> None:
    """In a shielded mpiexec (``shield_mpiexec``): SIGTERM blocked, and SIGKILL when the agent dies."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # SIGTERM is blocked here
    except (OSError, AttributeError):
        pass


def signal_group(proc: subprocess.Popen, signum: signal.Signals, sent: list[str] | None) -> None:
    """Signal the child's process group; a SIGKILL also reaches its descendants in other sessions.
    ``sent`` collects the names of the signals that were delivered."""
    # MPI ranks run in sessions of their own; a SIGKILL must reach them before mpiexec
    # dies and they are re-parented out of reach.
    # returncode, not poll(): a poll here could reap the child and lose its resource usage (reap).
    strays = descendants(proc.pid) if signum == signal.SIGKILL and proc.returncode is None else []
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass
    else:
        if sent is not None:
            sent.append(signum.name)
    for pid in strays:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def descendants(root: int) -> list[int]:
    """Every live descendant of ``root``, from /proc (empty where there is no /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


@dataclass(frozen=True)
class Usage:
    """What a payload process used, as Linux counts it when its parent reaps it (wait4(2)): CPU seconds,
    user plus system, of the process and every descendant it waited for (mpiexec's ranks, a tool's
    children); and the peak resident set of the largest of them (``ru_maxrss``, KiB on Linux), in MiB."""

    cpu_s: float
    max_rss_mb: float

    @classmethod
    def of(cls, ru) -> Usage:
        return cls(round(ru.ru_utime + ru.ru_stime, 3), round(ru.ru_maxrss / 1024, 1))


def reap(proc: subprocess.Popen, timeout: float) -> Usage | None:
    """Wait up to ``timeout`` s for ``proc`` to end; when it has, reap it with wait4 (setting
    ``proc.returncode`` as Popen would) and return its Usage. None while it runs, or when it was
    reaped elsewhere (then Popen's own poll settles its returncode)."""
    deadline = time.monotonic() + timeout
    while proc.returncode is None:
        try:
            pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        except ChildProcessError:
            proc.poll()
            return None
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return Usage.of(ru)
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        time.sleep(min(0.01, left))  # Popen.wait(timeout) polls the same way, up to 50 ms apart
    return None
