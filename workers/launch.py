"""Run one payload process for one work item: the launcher the agent and ``upwell payload run`` share.

``run_payload`` prepares the work directory, starts the registered module
(plain, under mpiexec, or under torchrun) in its own process group, streams its
output to ``payload.log``, calls ``on_tick`` every few seconds, forwards a stop
request as a signal, and turns the exit into a ``LaunchResult``. The contract is
written down in ``workers/payloads/README.md``.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from upwell import logs
from upwell.errors import InputRejected
from upwell.messages import WorkItem
from upwell.payloads import builtin as registry
from workers import warm
from workers.payloads.common import EXIT_BAD_INPUT, EXIT_FILE, ITEM_FILE, METRICS_FILE, read_progress

log = logs.get("workers.launch")

TAIL_BYTES = 4096
FINE_S = 0.5  # for this long after a payload starts, its CPU wait (CpuWait) is sampled every 10 ms, then 100 ms
TICK_S = 5.0  # how often on_tick runs: well inside a queue lease of 30 s or more
GRACE_S = 15.0  # how long a stopped payload may take to checkpoint before it is killed
TERM_S = 3.0  # after the grace: SIGTERM (mpiexec then tears the job down), then SIGKILL
REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class LaunchResult:
    """What one attempt of a payload came to.

    status is "succeeded" (exit 0), "preempted" (exit 75: stopped and checkpointed)
    or "failed" (anything else, or a timeout). ``permanent`` is True for exit 65
    (the payload says its input is unusable, so a retry cannot help).
    """

    status: str
    exit_code: int | None
    metrics: dict[str, Any]
    artifacts: list[Path]
    checkpoint_dir: Path
    checkpoints: int
    resumed_from: Any
    stderr_tail: str
    run_s: float
    log_path: Path | None = None
    timed_out: bool = False
    permanent: bool = False
    definition: dict[str, Any] = field(default_factory=dict)  # name, version, sha256, image digest (provenance)
    cpu_wait_s: float = 0.0  # how long the payload waited for a CPU it was ready to use (CpuWait)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["artifacts"] = [str(p) for p in self.artifacts]
        data["checkpoint_dir"] = str(self.checkpoint_dir)
        data["log_path"] = str(self.log_path) if self.log_path else None
        return data


def run_payload(item: WorkItem, workdir: Path, *, input_path: Path | None = None,
                resume_dir: Path | None = None, stop: threading.Event | None = None,
                on_tick: Callable[[], None] | None = None, timeout_s: float | None = None,
                tick_s: float = TICK_S, grace_s: float = GRACE_S, ranks: int | None = None,
                definitions=None) -> LaunchResult:
    """Run ``item``'s payload to an end in ``workdir`` and report how it ended.

    ``ranks``: what the node's allocation gives (a Slurm job's CPUs); an MPI payload
    runs with that many ranks instead of the item's. ``definitions`` is the registry to
    resolve the item's payload in (built-ins only when None). A definition with a
    ``module`` runs here; any other runs its argv through ``workers.runner``.

    Raises InputRejected (permanent) when the payload is not registered, its
    parameters do not validate, or it needs an input and none was given.
    """
    loaded = resolve(item, definitions)
    if ranks and loaded.definition.launcher.kind == "mpi":
        item = dataclasses.replace(item, ranks=int(ranks))
    if not loaded.definition.module:
        from workers.runner import run_definition

        return run_definition(loaded, item, workdir, input_path=input_path, resume_dir=resume_dir, stop=stop,
                              on_tick=on_tick, timeout_s=timeout_s, tick_s=tick_s)
    result = _run_module(registry.spec_of(loaded.definition), item, workdir, input_path=input_path,
                         resume_dir=resume_dir, stop=stop, on_tick=on_tick, timeout_s=timeout_s, tick_s=tick_s,
                         grace_s=grace_s)
    from workers.runner import provenance

    result.definition = provenance(loaded)
    return result


def resolve(item: WorkItem, definitions=None):
    """The definition the item names: the exact version and content ingest validated, when it recorded them."""
    from upwell.payloads.registry import Registry

    ref = f"{item.payload}@{item.payload_version}" if item.payload_version else item.payload
    return (definitions or Registry()).resolve(ref, sha256=item.payload_sha256)


def _run_module(spec: registry.PayloadSpec, item: WorkItem, workdir: Path, *, input_path: Path | None,
                resume_dir: Path | None, stop: threading.Event | None, on_tick: Callable[[], None] | None,
                timeout_s: float | None, tick_s: float, grace_s: float) -> LaunchResult:
    workdir = Path(workdir).resolve()
    params = validate_params(spec, item.params)
    if spec.needs_input and input_path is None:
        raise InputRejected(f"payload {spec.name!r} needs an input file", field="input_blob")
    prepare_workdir(item, workdir, params=params, input_path=input_path, resume_dir=resume_dir,
                    launcher=spec.launcher)
    before = read_progress(workdir / "ckpt")
    if stop is not None and stop.is_set():
        return _result(workdir, "preempted", None, before, "", 0.0)
    command = build_command(spec, item, workdir)
    started = time.monotonic()
    forkable = spec.launcher == "python" or (spec.launcher == "torchrun" and max(1, int(item.ranks)) == 1)
    proc, streams = _start(command, workdir, child_env(spec, item), warm_ok=forkable,
                           shield_mpiexec=_shield_mpiexec(spec.launcher))
    outcome = _supervise(proc, stop=stop, on_tick=on_tick, timeout_s=timeout_s, tick_s=tick_s,
                         grace_s=grace_s, stop_signal=stop_signal_for(spec, item))
    streams.join()
    status = _status(proc.returncode, workdir, outcome)
    return _result(workdir, status, proc.returncode, before, streams.tail(), time.monotonic() - started,
                   timed_out=outcome.timed_out, cpu_wait_s=outcome.cpu_wait_s)


def validate_params(spec: registry.PayloadSpec, params: dict[str, Any]) -> dict[str, Any]:
    from pydantic import ValidationError

    try:
        return spec.params.model_validate(params).model_dump(mode="json")
    except ValidationError as exc:
        first = exc.errors()[0]
        name = ".".join(str(p) for p in first.get("loc", ())) or "params"
        raise InputRejected(f"{spec.name} parameter {name}: {first.get('msg')}",
                            field=f"params.{name}") from None


def prepare_workdir(item: WorkItem, workdir: Path, *, params: dict[str, Any], input_path: Path | None,
                    resume_dir: Path | None, launcher: str) -> None:
    """Write item.json, fill ckpt/ from resume_dir, and start out/ empty."""
    workdir.mkdir(parents=True, exist_ok=True)
    ckpt, out = workdir / "ckpt", workdir / "out"
    ckpt.mkdir(exist_ok=True)
    if resume_dir is not None and Path(resume_dir).resolve() != ckpt:
        shutil.copytree(resume_dir, ckpt, dirs_exist_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    (workdir / EXIT_FILE).unlink(missing_ok=True)
    doc = {"schema": 1, "job_id": item.job_id, "shard_id": item.shard_id, "payload": item.payload,
           "params": params, "attempt": item.attempt, "ranks": item.ranks, "gpus": item.gpus,
           "input_path": str(Path(input_path).resolve()) if input_path else None,
           "input_blob": item.input_blob, "trace_id": item.trace_id, "launcher": launcher,
           "checkpoint_prefix": item.checkpoint_prefix, "result_prefix": item.result_prefix}
    (workdir / ITEM_FILE).write_text(json.dumps(doc, indent=1))


def build_command(spec: registry.PayloadSpec, item: WorkItem, workdir: Path) -> list[str]:
    """The definition's argv ({python} -m <module> --workdir {workdir}) under the payload's launcher."""
    from upwell.payloads.definition import render

    values = {"python": sys.executable, "workdir": str(workdir)}
    tail = [render(a, values) for a in spec.command][1:]
    ranks = max(1, int(item.ranks))
    if spec.launcher == "mpi":
        return [find_mpiexec(), "-n", str(ranks), "--oversubscribe", "--bind-to", "none", sys.executable, *tail]
    if spec.launcher == "torchrun" and ranks > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks),
                *tail]
    if spec.launcher not in ("python", "torchrun", "mpi"):
        raise InputRejected(f"payload {spec.name!r} has unknown launcher {spec.launcher!r}", field="payload")
    return [sys.executable, *tail]


def find_mpiexec() -> str:
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if found is None:
        raise FileNotFoundError("mpiexec is neither beside the Python interpreter nor on PATH")
    return found


def stop_signal_for(spec: registry.PayloadSpec, item: WorkItem) -> signal.Signals:
    # Open MPI's mpiexec kills its ranks within a second of SIGTERM, too soon to
    # gather and write a checkpoint; it forwards SIGUSR1 and lets them finish.
    return signal.SIGUSR1 if spec.launcher == "mpi" else signal.SIGTERM


def child_env(spec: registry.PayloadSpec, item: WorkItem) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    ranks = max(1, int(item.ranks))
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // ranks)))
    if spec.launcher == "mpi" and hasattr(os, "geteuid") and os.geteuid() == 0:
        # Containers run as a non-root user; a developer shell or CI runner may be root.
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


class _Streams:
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


def _die_with_parent() -> None:
    """In the child: have Linux send SIGTERM when the agent dies (even by SIGKILL), so a payload never
    outlives its agent and runs beside the retry of its own shard. Elsewhere this does nothing."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _shield_mpiexec(launcher: str) -> bool:
    """Inside a Slurm job, Slurm signals every process of the step (scancel, preemption, a node taken
    away), mpiexec included, and mpiexec kills its ranks within a second of SIGTERM: before they can
    checkpoint. So there mpiexec starts with SIGTERM blocked; the ranks (Open MPI unblocks signals in
    them) still get Slurm's SIGTERM, checkpoint and exit 75; SIGKILL after KillWait still ends all."""
    return launcher == "mpi" and bool(os.environ.get("SLURM_JOB_ID"))


def _shielded_child() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # SIGTERM is blocked here
    except (OSError, AttributeError):
        pass


def _start(command: list[str], workdir: Path, env: dict[str, str], *, warm_ok: bool = False,
           shield_mpiexec: bool = False) -> tuple[subprocess.Popen, _Streams]:
    log_path = workdir / "payload.log"
    with open(log_path, "ab") as handle:
        handle.write(f"$ {' '.join(command)}\n".encode())
    if warm_ok and command[:2] == [sys.executable, "-m"] and warm.enabled():  # fork a Python payload warm
        return warm.runner().start_payload(command[2], command[3:], workdir, env, log_path)
    proc = subprocess.Popen(command, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=_shielded_child if shield_mpiexec else _die_with_parent)
    return proc, _Streams(proc, log_path)


@dataclass
class _Outcome:
    stopped: bool = False  # a stop request was forwarded
    timed_out: bool = False
    signals: list[str] = field(default_factory=list)
    cpu_wait_s: float = 0.0


class CpuWait:
    """How long a payload waited for a CPU while it was ready to run: the run-queue delay Linux keeps for
    every task (``/proc/<pid>/schedstat``, second field, in ns), read for the payload's process and, once a
    second, for its descendants (MPI ranks); the figure is the most any one of them waited, since the
    slowest rank sets the pace. Local pools run every node on one machine, so this is time a node of its
    own would not have spent (the agent takes it off a local shard's node time). Zero without /proc."""

    TREE_S = 1.0

    @staticmethod
    def wanted() -> bool:
        """Only where local nodes share the machine (UPWELL_SHARED_MACHINE): elsewhere nothing reads it."""
        from upwell.settings import env_bool

        return env_bool(os.environ, "UPWELL_SHARED_MACHINE")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.waited: dict[int, int] = {}  # pid -> ns, the last reading
        self._tree: list[int] = []
        self._tree_at = time.monotonic()  # the first look for descendants a second in: a short payload has none

    def sample(self, now: float) -> None:
        if now - self._tree_at >= self.TREE_S:
            self._tree, self._tree_at = _descendants(self.pid), now
        for pid in (self.pid, *self._tree):
            ns = run_delay_ns(f"/proc/{pid}/schedstat")
            if ns is not None:
                self.waited[pid] = max(self.waited.get(pid, 0), ns)

    @property
    def seconds(self) -> float:
        return max(self.waited.values(), default=0) / 1e9


def run_delay_ns(schedstat: str) -> int | None:
    """A task's run-queue delay in ns, the second field of its schedstat file; None when it cannot be read."""
    try:
        with open(schedstat, "rb") as handle:
            return int(handle.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _supervise(proc: subprocess.Popen, *, stop: threading.Event | None, on_tick: Callable[[], None] | None,
               timeout_s: float | None, tick_s: float, grace_s: float, stop_signal: signal.Signals) -> _Outcome:
    """Wait for the child, ticking; on stop or timeout escalate: stop signal, SIGTERM, SIGKILL."""
    outcome = _Outcome()
    start = next_tick = time.monotonic()
    ladder: list[tuple[float, signal.Signals]] = []
    waits = CpuWait(proc.pid) if CpuWait.wanted() else None
    while proc.poll() is None:
        now = time.monotonic()
        if waits is not None:
            waits.sample(now)
        if now >= next_tick:
            _tick(on_tick)
            next_tick = now + tick_s
        wants_stop = stop is not None and stop.is_set()
        late = timeout_s is not None and now - start > timeout_s
        if (wants_stop or late) and not ladder and not outcome.signals:
            outcome.stopped, outcome.timed_out = wants_stop, late and not wants_stop
            ladder = _ladder(now, stop_signal, grace_s)
        while ladder and ladder[0][0] <= now:
            _signal_group(proc, ladder.pop(0)[1], outcome)
        try:  # sampled finely at first: a 0.1 s payload would end between two 0.1 s polls
            proc.wait(timeout=0.01 if waits is not None and now - start < FINE_S else 0.1)
        except subprocess.TimeoutExpired:
            pass
    _signal_group(proc, signal.SIGKILL, None)  # stragglers left in the group
    outcome.cpu_wait_s = round(waits.seconds, 3) if waits is not None else 0.0
    return outcome


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


def _signal_group(proc: subprocess.Popen, signum: signal.Signals, outcome: _Outcome | None) -> None:
    # MPI ranks run in sessions of their own; a SIGKILL must reach them before mpiexec
    # dies and they are re-parented out of reach.
    strays = _descendants(proc.pid) if signum == signal.SIGKILL and proc.poll() is None else []
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass
    else:
        if outcome is not None:
            outcome.signals.append(signum.name)
    for pid in strays:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _descendants(root: int) -> list[int]:
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


def _status(code: int | None, workdir: Path, outcome: _Outcome) -> str:
    if outcome.timed_out:
        return "failed"
    if code == registry.EXIT_OK:
        return "succeeded"
    if code == registry.EXIT_PREEMPTED:
        return "preempted"
    # A stop that lands before the payload installed its handler (a spot eviction during start-up)
    # kills it with that very signal: the agent stopped it, it did not fail on its own.
    if outcome.stopped and code is not None and -code in (signal.SIGTERM, signal.SIGUSR1):
        return "preempted"
    # torchrun exits 1 after forwarding SIGTERM, whatever its workers returned;
    # rank 0 leaves exit.json behind when it checkpointed and exited 75.
    if outcome.stopped and _read_json(workdir / EXIT_FILE).get("status") == "preempted":
        return "preempted"
    return "failed"


def _result(workdir: Path, status: str, code: int | None, before: dict | None, tail: str, run_s: float,
            *, timed_out: bool = False, cpu_wait_s: float = 0.0) -> LaunchResult:
    after = read_progress(workdir / "ckpt")
    written = int((after or {}).get("count", 0)) - int((before or {}).get("count", 0))
    out = workdir / "out"
    artifacts = sorted(p for p in out.rglob("*") if p.is_file() and p.name != METRICS_FILE
                       and not (p.name.startswith(".") and p.name.endswith(".tmp")))
    log_path = workdir / "payload.log"
    return LaunchResult(status=status, exit_code=code, metrics=_read_json(out / METRICS_FILE),
                        artifacts=artifacts, checkpoint_dir=workdir / "ckpt", checkpoints=max(0, written),
                        resumed_from=before.get("marker") if before else None, stderr_tail=tail,
                        run_s=round(run_s, 3), log_path=log_path if log_path.exists() else None,
                        timed_out=timed_out, permanent=code == EXIT_BAD_INPUT, cpu_wait_s=cpu_wait_s)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
