"""Run a definition's argv for one work item: the path for tools that are not Python payload modules.

Steps, all in the work dir W and none through a shell: write the definition's
``files`` (templates), place the shard's input at ``input.path``, put the kept
checkpoint back (``workers.checkpoints``: only the declared checkpoint files count;
an empty one, or one that fails ``checkpoint.verify``, means a fresh start), run each
``prepare`` argv, then the ``command`` (under the launcher; with ``checkpoint.resume``
appended when a checkpoint is there), supervised by the same loop as the Python payloads
(``workers.payload_process``): lease ticks, the definition's stop signal and grace on a
stop request. A resumed command that fails without writing a newer checkpoint could not
read it: the checkpoint is dropped and the command runs once more from a fresh start.
Then the newest checkpoint files are linked into ``W/.upwell-kept/`` (the agent uploads
them), and on success the post-steps run, artifacts are copied to ``W/out/`` and metrics
are read (JSON files, named regexes over the tool's log and each post-step's output).

How an attempt ends: exit 0 is success; a code in ``exit_codes.preempted`` is a
preemption; when the runner itself stopped the tool, any exit with a checkpoint
file present is a preemption too (GROMACS exits 1 after writing its checkpoint on
SIGTERM), and so is a gang whose ranks Slurm ended with SIGTERM (``workers.gang.stopped_by_slurm``);
a code in ``exit_codes.bad_input`` is permanent; anything else fails.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from upwell import provenance as upwell_provenance
from upwell import shape
from upwell.errors import InputRejected
from upwell.messages import WorkItem
from upwell.payloads import params as payload_params
from upwell.payloads.argv import command_argv, values_for
from upwell.payloads.definition import Definition, Launcher, render
from upwell.payloads.validate import Loaded
from workers import checkpoints, gang, gpus
from workers.payload_process import TAIL_BYTES, TICK_S, start, supervise
from workers.procs import shield_mpiexec
from workers.workdir import LaunchResult, log_line, output_bytes, prepare_workdir, read_json

if TYPE_CHECKING:
    from workers.supervision import NodeClock

STEP_TIMEOUT_S = 600.0


def _env(d: Definition, item: WorkItem, gpu_ids: list[str] | None = None) -> dict[str, str]:
    env = gpus.visible(dict(os.environ), gpu_ids)
    env.setdefault("OMP_NUM_THREADS", str(d.resources.cpus))
    env.update(d.env)
    if d.launcher.kind == "mpi" and hasattr(os, "geteuid") and os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


def _step(argv: list[str], workdir: Path, env: dict[str, str], stdin: str = "", *,
          own: bool = False) -> tuple[int, str]:
    """Run one prepare or post step to its end; (exit code, its output), also appended to payload.log. ``own``:
    upwell's probe (the version_command, recorded in the result), whose output is not the payload's either."""
    try:
        done = subprocess.run(argv, cwd=workdir, env=env, input=stdin.encode(), capture_output=True,
                              timeout=STEP_TIMEOUT_S, start_new_session=True)
        code, text = done.returncode, (done.stdout + done.stderr).decode(errors="replace")
    except FileNotFoundError:
        code, text = 127, f"{argv[0]}: not found on PATH\n"
    except subprocess.TimeoutExpired:
        code, text = 124, f"{argv[0]}: timed out after {STEP_TIMEOUT_S:.0f} s\n"
    log_line(workdir, f"$ {' '.join(argv)}\n")  # upwell's line; the step's output is the payload's
    if own:
        log_line(workdir, text)
        return code, text
    with open(workdir / "payload.log", "a", encoding="utf-8") as fh:
        fh.write(text)
    return code, text


def _regex_metrics(patterns: dict[str, str], text: str) -> dict[str, Any]:
    """Each named regex's last match: group 'value' if named, else group 1, as a number when it is one."""
    out: dict[str, Any] = {}
    for name, pattern in patterns.items():
        matches = list(re.finditer(pattern, text, re.MULTILINE))
        if not matches:
            continue
        m = matches[-1]
        raw = m.group("value") if "value" in m.re.groupindex else m.group(1 if m.re.groups else 0)
        try:
            out[name] = float(raw)
        except (TypeError, ValueError):
            out[name] = raw
    return out


def _status(d: Definition, code: int | None, outcome, kept: int) -> str:
    if outcome.timed_out:
        return "failed"
    if code in d.exit_codes.preempted or (outcome.stopped and kept):
        return "preempted"
    return "succeeded" if code == 0 and not outcome.stopped else "failed"


@dataclass
class _Attempt:
    """What one attempt's command runs with: shared by the first run and a fresh restart."""

    d: Definition
    item: WorkItem
    workdir: Path
    values: dict[str, str]
    env: dict[str, str]
    stop: threading.Event | None
    on_tick: Callable[[], None] | None
    timeout_s: float | None
    tick_s: float
    clock: NodeClock | None
    apptainer: bool

    def run(self, resumed: bool):
        """The command to its end; (exit code, outcome, tail), or (127, None, why) when it is not found."""
        d = self.d
        argv = command_for(d, self.item, self.values, self.workdir, resumed, apptainer=self.apptainer)
        try:
            proc, streams = start(argv, self.workdir, self.env, shield_mpiexec=shield_mpiexec(d.launcher.kind))
        except FileNotFoundError:
            return 127, None, f"{argv[0]}: not found on PATH"
        outcome = supervise(proc, stop=self.stop, on_tick=self.on_tick, timeout_s=self.timeout_s, tick_s=self.tick_s,
                            grace_s=d.checkpoint.grace_s, stop_signal=signal.Signals[d.checkpoint.signal],
                            clock=self.clock)
        streams.join()
        return proc.returncode, outcome, streams.tail()


def run_definition(loaded: Loaded, item: WorkItem, workdir: Path, *, input_path: Path | None = None,
                   resume_dir: Path | None = None, stop: threading.Event | None = None,
                   on_tick: Callable[[], None] | None = None, timeout_s: float | None = None,
                   tick_s: float = TICK_S, clock: NodeClock | None = None, apptainer: bool = False,
                   gpu_ids: list[str] | None = None) -> LaunchResult:
    """Run one attempt of ``item`` with definition ``loaded``; InputRejected for bad params or input.
    ``clock``: the node clock that watches the tool for CPU wait (``workers.supervision``); None: nothing.
    ``apptainer``: run the command in the definition's image through Apptainer (the pool's option).
    ``gpu_ids``: the node's GPUs the shard was given (``workers.gpus``); None leaves the environment's.
    A resume that fails without writing a newer checkpoint means the tool could not read it: the checkpoint
    is dropped and the command runs once more from a fresh start, and the result says so."""
    d = loaded.definition
    workdir = Path(workdir).resolve()
    params = payload_params.validate(d, item.params)
    if d.input.required and input_path is None:
        raise InputRejected(f"payload {d.name!r} needs an input file", field="input_blob")
    prepare_workdir(item, workdir, params=params, input_path=input_path, resume_dir=resume_dir,
                    launcher=d.launcher.kind)
    values = values_for(d, item, workdir, params)
    _write_inputs(d, workdir, values, input_path)
    started, env = time.monotonic(), _env(d, item, gpu_ids)
    restored = _verified(d, checkpoints.restore(d, workdir), workdir, values, env)
    ended = functools.partial(_result, loaded, workdir, started=started, restored=restored,
                              version=tool_version(loaded, workdir, values, env))
    for argv in d.prepare:
        code, text = _step([render(a, values) for a in argv], workdir, env)
        if code != 0:
            return ended("failed", code, text[-TAIL_BYTES:], permanent=code in d.exit_codes.bad_input)
    if stop is not None and stop.is_set():
        return ended("preempted", None, "")
    attempt = _Attempt(d, item, workdir, values, env, stop, on_tick, timeout_s, tick_s, clock, apptainer)
    code, outcome, tail = _run_or_start_fresh(attempt, restored)
    if outcome is None:
        return ended("failed", code, tail)
    kept, n = checkpoints.keep(d, workdir)
    status = "preempted" if gang.stopped_by_slurm(code, int(item.nodes)) else _status(d, code, outcome, n)
    if status == "succeeded":
        failed = _post(d, workdir, values, env)
        if failed:
            status, tail = "failed", failed
    return ended(status, code, tail, kept=kept, written=n, timed_out=outcome.timed_out,
                 permanent=code in d.exit_codes.bad_input, cpu_wait_s=outcome.cpu_wait_s).measured(outcome)


_VERSIONS: dict[str, str] = {}  # definition content hash -> what its version_command said, on this node
_VERSIONS_LOCK = threading.Lock()


def tool_version(loaded: Loaded, workdir: Path, values: dict[str, str], env: dict[str, str]) -> str:
    """The tool's version from the definition's ``version_command``, run once per node (this agent's process)
    and definition (its content hash); '' when it declares none. A command that fails records that it did."""
    d = loaded.definition
    if not d.version_command:
        return ""
    with _VERSIONS_LOCK:  # slots of one agent run it once between them
        if loaded.sha256 not in _VERSIONS:
            code, text = _step([render(a, values) for a in d.version_command], workdir, env, own=True)
            said = upwell_provenance.tool_version(text)
            _VERSIONS[loaded.sha256] = said if code == 0 else f"unknown (version_command exited {code}: {said})"
        return _VERSIONS[loaded.sha256]


def _run_or_start_fresh(attempt: _Attempt, restored: checkpoints.Restored):
    """Run the command (resuming when ``restored`` holds a checkpoint). A resume that fails on its own without
    writing a newer checkpoint could not read it: drop it, say so in ``restored``, and run once more fresh."""
    d, workdir = attempt.d, attempt.workdir
    code, outcome, tail = attempt.run(restored.resumed)
    if restored.resumed and _unreadable(d, code, outcome) and checkpoints.fingerprint(d, workdir) == restored.files:
        checkpoints.discard(d, workdir)
        restored.files = {}
        restored.note = f"the tool could not resume from its checkpoint (exit {code}): started fresh"
        code, outcome, tail = attempt.run(False)
    return code, outcome, tail


def _unreadable(d: Definition, code: int | None, outcome) -> bool:
    """A resumed run that failed on its own (not stopped, not timed out, not a preemption or bad input)."""
    if outcome is None or outcome.stopped or outcome.timed_out:
        return False
    return code not in (0, *d.exit_codes.preempted, *d.exit_codes.bad_input)


def _verified(d: Definition, restored: checkpoints.Restored, workdir: Path, values: dict[str, str],
              env: dict[str, str]) -> checkpoints.Restored:
    """Run the definition's ``checkpoint.verify`` on a checkpoint about to be resumed; a non-zero exit drops it."""
    if not restored.resumed or not d.checkpoint.verify:
        return restored
    code, text = _step([render(a, values) for a in d.checkpoint.verify], workdir, env)
    if code == 0:
        return restored
    checkpoints.discard(d, workdir)
    last = (text.strip().splitlines() or [""])[-1][:200]
    return checkpoints.Restored(note=f"the checkpoint failed its verify step (exit {code}: {last}): started fresh")


def command_for(d: Definition, item: WorkItem, values: dict[str, str], workdir: Path, resumed: bool, *,
                apptainer: bool = False) -> list[str]:
    """The command's argv: under the definition's launcher, or, for a shard of several nodes with an MPI
    launcher, under the gang's launch over the allocation (workers.gang) instead of the definition's
    mpiexec; in the definition's image through Apptainer where the pool says so."""
    full = command_argv(d, values, resume=resumed)
    plain = command_argv(d.model_copy(update={"launcher": Launcher()}), values, resume=resumed)
    prefix = full[: len(full) - len(plain)]
    if d.launcher.kind == "mpi" and int(item.nodes) > 1:
        prefix = gang.launch_argv(shape.of_item(item), cores=gang.node_cores())
    return [*prefix, *gang.container_prefix(d.image, d.resources.gpus, str(workdir), apptainer=apptainer), *plain]


def _write_inputs(d: Definition, workdir: Path, values: dict[str, str], input_path: Path | None) -> None:
    for name, template in d.files.items():
        path = workdir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(template, values))
    if input_path is not None:
        dest = workdir / d.input.path
        dest.parent.mkdir(parents=True, exist_ok=True)
        if Path(input_path).is_dir():  # a folder input (a reduce's results): the folder is the input
            shutil.copytree(input_path, dest, dirs_exist_ok=True)
        elif Path(input_path).resolve() != dest.resolve():
            shutil.copy2(input_path, dest)


def _post(d: Definition, workdir: Path, values: dict[str, str], env: dict[str, str]) -> str:
    """Run the post-steps, collecting metrics into W/out/metrics.json; the failing step's output, or ''."""
    metrics = read_json(workdir / d.outputs.metrics_json) if d.outputs.metrics_json else {}
    log_text = (workdir / "payload.log").read_text(errors="replace")
    metrics.update(_regex_metrics(d.outputs.metrics_regex, log_text))
    for step in d.outputs.post:
        code, text = _step([render(a, values) for a in step.command], workdir, env, render(step.stdin, values))
        if code != 0:
            return f"post-step {step.command[0]} exited {code}:\n{text[-TAIL_BYTES:]}"
        if step.metrics_json:
            metrics.update(read_json(workdir / step.metrics_json))
        metrics.update(_regex_metrics(step.metrics_regex, text))
    out = workdir / "out"
    for path in checkpoints.matches(workdir, d.outputs.artifacts):
        if not path.is_relative_to(out):
            shutil.copy2(path, out / path.name)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1))
    return ""


def _result(loaded: Loaded, workdir: Path, status: str, code: int | None, tail: str, *, started: float,
            restored: checkpoints.Restored, version: str = "", kept: Path | None = None, written: int = 0,
            timed_out: bool = False, permanent: bool = False, cpu_wait_s: float = 0.0) -> LaunchResult:
    out = workdir / "out"
    artifacts = sorted(p for p in out.rglob("*") if p.is_file() and p.name != "metrics.json")
    log_path = workdir / "payload.log"
    return LaunchResult(
        status=status, exit_code=code, metrics=read_json(out / "metrics.json") if status == "succeeded" else {},
        artifacts=artifacts, checkpoint_dir=kept or workdir / "ckpt", checkpoints=written,
        resumed_from="checkpoint" if restored.resumed else None, stderr_tail=tail,
        run_s=round(time.monotonic() - started, 3), log_path=log_path if log_path.exists() else None,
        log_bytes=output_bytes(workdir), timed_out=timed_out, permanent=permanent and status == "failed",
        definition=provenance(loaded, version),
        cpu_wait_s=cpu_wait_s, checkpoint_note=restored.note)


def provenance(loaded: Loaded, tool: str = "") -> dict[str, Any]:
    """What a result records of the definition that produced it; ``tool``: its version_command's answer."""
    d = loaded.definition
    out = {"name": d.name, "version": d.version, "sha256": loaded.sha256, "image": d.image,
           "image_digest": d.digest, "builtin": loaded.builtin,
           "report": d.report.model_dump(exclude_defaults=True)}
    return {**out, "tool_version": tool} if tool else out
