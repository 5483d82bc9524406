"""Run one payload process for one work item: the launcher the agent and ``upwell payload run`` share.

``run_payload`` prepares the work directory (``workers.workdir``), starts the registered module
(plain, under mpiexec, or under torchrun; a shard of several nodes under ``workers.gang``'s launch over
the allocation) in its own process group, streams its output to
``payload.log``, calls ``on_tick`` every few seconds, forwards a stop request as a signal
(``workers.payload_process``), and turns the exit into a ``LaunchResult``. A definition without a module
runs through ``workers.runner``. The contract is written down in ``workers/payloads/README.md``.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from upwell import shape
from upwell.errors import ConfigError, InputRejected
from upwell.messages import WorkItem
from upwell.payloads import builtin as registry
from workers import gang, gpus
from workers.gang import node_cores
from workers.payload_process import GRACE_S, TICK_S, Outcome, start, supervise
from workers.payloads.common import EXIT_BAD_INPUT, EXIT_FILE, METRICS_FILE, read_progress
from workers.procs import REPO_ROOT, shield_mpiexec
from workers.runner import provenance, run_definition
from workers.workdir import LaunchResult, output_bytes, prepare_workdir, read_json

if TYPE_CHECKING:
    from workers.supervision import NodeClock

def run_payload(item: WorkItem, workdir: Path, *, input_path: Path | None = None,
                resume_dir: Path | None = None, stop: threading.Event | None = None,
                on_tick: Callable[[], None] | None = None, timeout_s: float | None = None,
                tick_s: float = TICK_S, grace_s: float = GRACE_S, ranks: int | None = None,
                definitions=None, clock: NodeClock | None = None, apptainer: bool = False) -> LaunchResult:
    """Run ``item``'s payload to an end in ``workdir`` and report how it ended.

    ``ranks``: what the node's allocation gives (a Slurm job's CPUs); an MPI payload
    runs with that many ranks instead of the item's. ``definitions`` is the registry to
    resolve the item's payload in (built-ins only when None). A definition with a
    ``module`` runs here; any other runs its argv through ``workers.runner``. ``clock``: the
    node clock the agent chose at start-up (``workers.supervision``); None watches nothing. ``apptainer``: a
definition's command runs in its image through Apptainer (``workers.gang.container_prefix``).

    Raises InputRejected (permanent) when the payload is not registered, its
    parameters do not validate, or it needs an input and none was given.
    """
    loaded = resolve(item, definitions)
    if ranks and loaded.definition.launcher.kind == "mpi":
        item = dataclasses.replace(item, ranks=int(ranks) * max(1, int(item.nodes)))
    shape.check_cores(shape.of_item(item), node_cores(), where="this node")  # at dispatch, as at submit
    with gpus.node().lease(int(item.gpus)) as chosen:  # the node's GPUs this shard may use (workers.gpus)
        if not loaded.definition.module:
            result = run_definition(loaded, item, workdir, input_path=input_path, resume_dir=resume_dir, stop=stop,
                                    on_tick=on_tick, timeout_s=timeout_s, tick_s=tick_s, clock=clock,
                                    apptainer=apptainer, gpu_ids=chosen)
        else:
            result = _run_module(registry.spec_of(loaded.definition), item, workdir, input_path=input_path,
                                 resume_dir=resume_dir, stop=stop, on_tick=on_tick, timeout_s=timeout_s,
                                 tick_s=tick_s, grace_s=grace_s, clock=clock, gpu_ids=chosen)
            result.definition = provenance(loaded)
    result.gpus = list(chosen or [])
    if int(item.nodes) > 1:  # the allocation's hosts, as Slurm or Batch lists them, for the result's provenance
        result.hosts = allocation_hosts(int(item.nodes))
    return result


def allocation_hosts(nodes: int) -> list[str]:
    """The first ``nodes`` hosts of the allocation (workers.gang); [] where they cannot be read, which must
    not fail a run that has ended."""
    try:
        return gang.hosts()[:nodes]
    except ConfigError:
        return []


def resolve(item: WorkItem, definitions=None):
    """The definition the item names: the exact version and content ingest validated, when it recorded them."""
    from upwell.payloads.registry import Registry

    ref = f"{item.payload}@{item.payload_version}" if item.payload_version else item.payload
    return (definitions or Registry()).resolve(ref, sha256=item.payload_sha256)


def _run_module(spec: registry.PayloadSpec, item: WorkItem, workdir: Path, *, input_path: Path | None,
                resume_dir: Path | None, stop: threading.Event | None, on_tick: Callable[[], None] | None,
                timeout_s: float | None, tick_s: float, grace_s: float, clock: NodeClock | None,
                gpu_ids: list[str] | None = None) -> LaunchResult:
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
    proc, streams = start(command, workdir, child_env(spec, item, gpu_ids), warm_ok=forkable,
                          shield_mpiexec=shield_mpiexec(spec.launcher))
    outcome = supervise(proc, stop=stop, on_tick=on_tick, timeout_s=timeout_s, tick_s=tick_s,
                        grace_s=grace_s, stop_signal=stop_signal_for(spec, item), clock=clock)
    streams.join()
    status = "preempted" if gang.stopped_by_slurm(proc.returncode, int(item.nodes)) else \
        _status(proc.returncode, workdir, outcome)
    return _result(workdir, status, proc.returncode, before, streams.tail(), time.monotonic() - started,
                   timed_out=outcome.timed_out, cpu_wait_s=outcome.cpu_wait_s).measured(outcome)


def validate_params(spec: registry.PayloadSpec, params: dict[str, Any]) -> dict[str, Any]:
    from pydantic import ValidationError

    try:
        return spec.params.model_validate(params).model_dump(mode="json")
    except ValidationError as exc:
        first = exc.errors()[0]
        name = ".".join(str(p) for p in first.get("loc", ())) or "params"
        raise InputRejected(f"{spec.name} parameter {name}: {first.get('msg')}",
                            field=f"params.{name}") from None


def build_command(spec: registry.PayloadSpec, item: WorkItem, workdir: Path) -> list[str]:
    """The definition's argv ({python} -m <module> --workdir {workdir}) under the payload's launcher."""
    from upwell.payloads.definition import render

    values = {"python": sys.executable, "workdir": str(workdir)}
    tail = [render(a, values) for a in spec.command][1:]
    ranks = max(1, int(item.ranks))
    if spec.launcher == "mpi" and int(item.nodes) > 1:  # a gang: every node of the allocation
        return [*gang.launch_argv(shape.of_item(item), cores=node_cores(), mpirun=find_mpiexec), sys.executable, *tail]
    if spec.launcher == "mpi":
        extra = ["--oversubscribe"] if item.oversubscribe else []  # only where the definition allowed it
        return [find_mpiexec(), "-n", str(ranks), *extra, "--bind-to", "none", sys.executable, *tail]
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


def child_env(spec: registry.PayloadSpec, item: WorkItem, gpu_ids: list[str] | None = None) -> dict[str, str]:
    env = gpus.visible(dict(os.environ), gpu_ids)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    ranks = max(1, int(item.ranks))
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // ranks)))
    if spec.launcher == "mpi" and hasattr(os, "geteuid") and os.geteuid() == 0:
        # Containers run as a non-root user; a developer shell or CI runner may be root.
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


def _status(code: int | None, workdir: Path, outcome: Outcome) -> str:
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
    if outcome.stopped and read_json(workdir / EXIT_FILE).get("status") == "preempted":
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
    return LaunchResult(status=status, exit_code=code, metrics=read_json(out / METRICS_FILE),
                        artifacts=artifacts, checkpoint_dir=workdir / "ckpt", checkpoints=max(0, written),
                        resumed_from=before.get("marker") if before else None, stderr_tail=tail,
                        run_s=round(run_s, 3), log_path=log_path if log_path.exists() else None,
                        log_bytes=output_bytes(workdir),
                        timed_out=timed_out, permanent=code == EXIT_BAD_INPUT, cpu_wait_s=cpu_wait_s)
