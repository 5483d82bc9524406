"""One payload process, from start to exit: the part the two launchers share (``workers.launch`` for the
Python payload modules, ``workers.runner`` for a definition's argv).

``start`` runs the command in its own process group (or forks it warm, ``workers.warm``) and streams its
output into ``payload.log``; ``supervise`` waits for it, calls ``on_tick`` every ``tick_s`` (the lease
extension), and on a stop request or a timeout walks the ladder: the payload's stop signal, then after
the grace SIGTERM, then SIGKILL. A node clock (``workers.supervision``) may watch the process for the
time it waited for a CPU; the Azure one watches nothing.
"""

from __future__ import annotations

import collections
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

from upwell import logs
from workers import warm
from workers.procs import die_with_parent, reap, shielded_child, signal_group
from workers.workdir import log_line

if TYPE_CHECKING:
    from workers.supervision import NodeClock

log = logs.get("workers.payload_process")

TAIL_BYTES = 4096
FINE_S = 0.5  # for this long after a payload starts, a watched payload is polled every 10 ms, then 100 ms
TICK_S = 5.0  # how often on_tick runs: well inside a queue lease of 30 s or more
GRACE_S = 15.0  # how long a stopped payload may take to checkpoint before it is killed
TERM_S = 3.0  # after the grace: SIGTERM (mpiexec then tears the job down), then SIGKILL


class Streams:
    """Copies the child's stdout and stderr into payload.log and keeps stderr's last bytes."""

    def __init__(self, proc: subprocess.Popen, log_path: Path) -> None:
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in join()
        self._lock = threading.Lock()
        self._tail: collections.deque[bytes] = collections.deque()
        self._tail_size = 0
        self._threads = [threading.Thread(target=self._pump, args=(proc.stdout, False), daemon=True),
                         threading.Thread(target=self._pump, args=(proc.stderr, True), daemon=True)]
        for thread in self._threads:
            thread.start()

    def _pump(self, stream: IO[bytes], keep: bool) -> None:
        for line in iter(stream.readline, b""):
            with self._lock:
                self._log.write(line)
                self._log.flush()
                if keep:
                    self._keep(line)
        stream.close()

    def _keep(self, line: bytes) -> None:
        self._tail.append(line)
        self._tail_size += len(line)
        while self._tail_size - len(self._tail[0]) >= TAIL_BYTES:
            self._tail_size -= len(self._tail.popleft())

    def join(self) -> None:
        for thread in self._threads:
            thread.join(timeout=10)
        if not any(thread.is_alive() for thread in self._threads):  # else a stray still holds the pipe
            self._log.close()

    def tail(self) -> str:
        return b"".join(self._tail)[-TAIL_BYTES:].decode(errors="replace")


def start(command: list[str], workdir: Path, env: dict[str, str], *, warm_ok: bool = False,
          shield_mpiexec: bool = False) -> tuple[subprocess.Popen, Streams]:
    """Start ``command`` in ``workdir`` in a session of its own; a Python module may be forked warm."""
    log_path = workdir / "payload.log"
    log_line(workdir, f"$ {' '.join(command)}\n")  # upwell's line, not the payload's output (output_bytes)
    if warm_ok and command[:2] == [sys.executable, "-m"] and warm.enabled():  # fork a Python payload warm
        return warm.runner().start_payload(command[2], command[3:], workdir, env, log_path)
    proc = subprocess.Popen(command, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=shielded_child if shield_mpiexec else die_with_parent)
    return proc, Streams(proc, log_path)


@dataclass
class Outcome:
    stopped: bool = False  # a stop request was forwarded
    timed_out: bool = False
    signals: list[str] = field(default_factory=list)
    cpu_wait_s: float = 0.0  # what the node clock's watch counted; 0 when nothing watched
    cpu_s: float | None = None  # the payload's CPU seconds and peak RSS (workers.procs.Usage); None: not known
    max_rss_mb: float | None = None


def supervise(proc: subprocess.Popen, *, stop: threading.Event | None, on_tick: Callable[[], None] | None,
              timeout_s: float | None, tick_s: float, grace_s: float, stop_signal: signal.Signals,
              clock: NodeClock | None = None) -> Outcome:
    """Wait for the child, ticking; on stop or timeout escalate: stop signal, SIGTERM, SIGKILL."""
    outcome = Outcome()
    start_at = next_tick = time.monotonic()
    ladder: list[tuple[float, signal.Signals]] = []
    watch = clock.watch(proc.pid) if clock is not None else None
    ended = _wait(proc, 0, outcome)
    while not ended:
        now = time.monotonic()
        if watch is not None:
            watch.sample(now)
        if now >= next_tick:
            _tick(on_tick)
            next_tick = now + tick_s
        wants_stop = stop is not None and stop.is_set()
        late = timeout_s is not None and now - start_at > timeout_s
        if (wants_stop or late) and not ladder and not outcome.signals:
            outcome.stopped, outcome.timed_out = wants_stop, late and not wants_stop
            ladder = _ladder(now, stop_signal, grace_s)
        while ladder and ladder[0][0] <= now:
            signal_group(proc, ladder.pop(0)[1], outcome.signals)
        # A watched payload is polled finely at first: a 0.1 s payload would end between two 0.1 s polls.
        ended = _wait(proc, 0.01 if watch is not None and now - start_at < FINE_S else 0.1, outcome)
    signal_group(proc, signal.SIGKILL, None)  # stragglers left in the group
    outcome.cpu_wait_s = round(watch.seconds, 3) if watch is not None else 0.0
    return outcome


def _wait(proc, timeout: float, outcome: Outcome) -> bool:
    """Wait up to ``timeout`` s for the payload to end; True once it has, its usage then in ``outcome``.
    A process of ours is reaped with wait4 (``workers.procs.reap``); a warm one's usage comes from the
    forkserver that reaped it."""
    if isinstance(proc, subprocess.Popen):
        used = reap(proc, timeout)
    else:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        used = getattr(proc, "usage", None)
    if used is not None:
        outcome.cpu_s, outcome.max_rss_mb = used.cpu_s, used.max_rss_mb
    return proc.returncode is not None


def _ladder(now: float, stop_signal: signal.Signals, grace_s: float) -> list[tuple[float, signal.Signals]]:
    steps = [(now, stop_signal)]
    if stop_signal != signal.SIGTERM:
        steps.append((now + grace_s, signal.SIGTERM))
        grace_s += TERM_S
    return [*steps, (now + grace_s, signal.SIGKILL)]


def _tick(on_tick: Callable[[], None] | None) -> None:
    if on_tick is None:
        return
    try:
        on_tick()
    except Exception:  # a failed lease extension is the agent's to act on, not a reason to kill the payload
        log.exception("launch.on_tick_failed")
