"""Pure builders for the Slurm backend: the sbatch script, the CLI argv, the squeue parser.

No I/O here; tests call each builder on its own. One agent is one Slurm job:
``sbatch --parsable`` submits the script below, named ``upwell-<pool>`` and
commented ``upwell-pool=<pool>`` so that ``squeue`` finds the pool's agents and
nothing else.

The script ``exec``s ``srun``, and ``srun`` runs the agent as step 0. That way
every route by which Slurm signals a job reaches the agent itself, not only a
shell that would wait for its child:

- ``scancel <job>`` (and preemption with GraceTime, a node taken away):
  SIGCONT + SIGTERM to every step and the batch step, SIGKILL after KillWait;
- ``scancel --signal=TERM <job>``: the steps only, that is the agent;
- ``scancel --batch --signal=...``: the batch step, which is srun, which forwards
  the signal to the agent;
- the time limit: ``--signal=TERM@<grace>`` warns the steps ``grace`` seconds
  before it.

On SIGTERM the agent preempts its payload, which checkpoints; the message goes
back on the queue at once. On SIGUSR1 the agent drains (finishes the item in
hand, then exits): the pool's scale-in sends that, to idle agents only.

Options read here (``UPWELL_POOLS.<pool>.options``): ``partition``, ``account``,
``qos``, ``constraint``, ``time`` (Slurm time, e.g. ``"8:00:00"``),
``cpus_per_task`` (default 1: the ranks an MPI payload gets), ``mem`` (e.g.
``"4G"``), ``gres`` (e.g. ``"gpu:1"``), ``exclusive`` (bool: the whole node; the
ranks are then the node's CPUs), ``spot`` (bool: the partition is a spot
nodearray), ``spot_partition`` (where the spot share of the agents goes),
``state_dir`` (a folder the pool and the nodes share, where agents write their
idle/running state), ``signal_grace_s`` (default 120), ``requeue`` (default false: the pool
replaces lost agents itself), ``python`` and ``workdir`` (the interpreter and
the upwell checkout on the nodes; default this interpreter and checkout),
``output`` (the job's log file; Slurm patterns allowed), ``srun_args`` and
``sbatch_args`` (extra arguments, lists), ``env``, ``storage_account`` and
``identity_client_id`` (as for the Azure pools), ``cores_per_node`` (a gang's
``--ntasks-per-node``: the ranks a node can hold), ``apptainer`` (bool: payloads run
in their definition's image through ``apptainer exec``; see ``apptainer_exec``).

Gangs: a shard of k nodes (upwell.shape) runs in one job of ``--nodes=k
--exclusive`` (whole nodes: the shard's ranks per node are known only to the agent,
which holds them against the node's cores at dispatch). Its one agent gets
``UPWELL_GANG_NODES=k`` and takes only items of k nodes (workers.gang); squeue's
``%D`` tells the pool each job's node count. Here the agent is the batch step itself
(the script ``exec``s it, on the allocation's first node), not a step: its payload
is a step of its own, ``srun --mpi=pmix`` over all k nodes, and srun turns a SIGTERM
it receives into a SIGKILL of every rank (srun(1): "forcing job termination"), so it
must not share a step with anything Slurm signals to checkpoint. So:

- ``scancel --signal=TERM <job>``, the time limit's ``--signal=TERM@<grace>``: the
  steps only, that is the ranks, which checkpoint and exit 75; srun passes the 75
  on, and the agent puts the item back and leaves (the allocation is going);
- ``scancel <job>``, preemption, a node taken away: the batch step as well; the
  agent stops the payload, srun's own SIGTERM kills the ranks at once, and the
  shard resumes from its last periodic checkpoint (``checkpoint_every``);
- the pool's drain (scale-in of an idle gang): ``scancel --batch --signal=USR1``.

Followed: scancel(1) ("by default, signals other than SIGKILL are not sent to the
batch step"; ``--batch`` signals only it), sbatch(1) and srun(1) of Slurm 22.05.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass

from upwell import REPO
from upwell.errors import ConfigError
from upwell.pools.base import PoolSpec

# squeue's fields in a fixed order; the comment is last because only it could hold the separator.
SQUEUE_FORMAT = "%i|%T|%P|%N|%D|%r|%j|%k"
_SQUEUE_FIELDS = 8
GANG_ENV = "UPWELL_GANG_NODES"  # the agent of a gang job: the allocation's node count (workers.gang reads it)
DEFAULT_GRACE_S = 120
_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$|^UNLIMITED$|^INFINITE$")
_SAFE = re.compile(r"^[A-Za-z0-9_.,:=+@/%-]+$")


def job_name(spec: PoolSpec) -> str:
    return f"upwell-{spec.name}"


def comment(spec: PoolSpec) -> str:
    return f"upwell-pool={spec.name}"


def node_id(pool: str, job_id: str) -> str:
    """The agent's node id (UPWELL_NODE_ID): the ledger's busy-node list matches on it."""
    return f"slurm-{pool}-{job_id}"


def _text(spec: PoolSpec, key: str) -> str | None:
    value = spec.options.get(key)
    if value is None or value == "":
        return None
    value = str(value)
    if not _SAFE.match(value):
        raise ConfigError(f"UPWELL_POOLS.{spec.name}.options.{key}: {value!r} holds characters Slurm "
                          "options do not take")
    return value


def _int(spec: PoolSpec, key: str, default: int, low: int = 0) -> int:
    try:
        value = int(spec.options.get(key, default))
    except (TypeError, ValueError):
        raise ConfigError(f"UPWELL_POOLS.{spec.name}.options.{key} must be an integer") from None
    if value < low:
        raise ConfigError(f"UPWELL_POOLS.{spec.name}.options.{key} must be >= {low}, got {value}")
    return value


def _list(spec: PoolSpec, key: str) -> list[str]:
    value = spec.options.get(key) or []
    if not isinstance(value, list):
        raise ConfigError(f"UPWELL_POOLS.{spec.name}.options.{key} must be a list of arguments")
    return [str(v) for v in value]


def partition(spec: PoolSpec, *, spot: bool = False) -> str | None:
    """A spot agent goes to ``spot_partition`` (a CycleCloud spot nodearray), the others to ``partition``."""
    if spot:
        value = _text(spec, "spot_partition")
        if not value:
            raise ConfigError(f"UPWELL_POOLS.{spec.name}.options.spot_partition is required for spot agents")
        return value
    return _text(spec, "partition")


def is_spot(spec: PoolSpec, part: str) -> bool:
    """Whether a job in partition ``part`` runs on spot nodes."""
    if spec.options.get("spot"):
        return True
    return bool(part) and part == spec.options.get("spot_partition")


def allocation(spec: PoolSpec, nodes: int = 1) -> list[str]:
    """One agent's allocation: one task of ``cpus_per_task`` CPUs on one node, or a gang's k whole nodes
    (``--ntasks-per-node`` from ``cores_per_node`` where the pool says how many ranks a node holds)."""
    if nodes <= 1:
        return ["--nodes=1", "--ntasks=1", f"--cpus-per-task={_int(spec, 'cpus_per_task', 1, low=1)}"]
    per_node = _int(spec, "cores_per_node", 0)
    return [f"--nodes={nodes}", *([f"--ntasks-per-node={per_node}"] if per_node else []), "--exclusive"]


def directives(spec: PoolSpec, *, spot: bool = False, nodes: int = 1) -> list[str]:
    """The #SBATCH lines: the pool's identity, its allocation (``nodes`` > 1: a gang), and the signal
    before the time limit."""
    lines = [f"--job-name={job_name(spec)}", f"--comment={comment(spec)}", *allocation(spec, nodes),
             f"--signal=TERM@{_int(spec, 'signal_grace_s', DEFAULT_GRACE_S)}",
             "--requeue" if spec.options.get("requeue") else "--no-requeue"]
    part = partition(spec, spot=spot)
    if part:
        lines.append(f"--partition={part}")
    for key in ("account", "qos", "constraint", "mem", "gres"):
        value = _text(spec, key)
        if value:
            lines.append(f"--{key}={value}")
    limit = _text(spec, "time")
    if limit:
        if not _TIME.match(limit):
            raise ConfigError(f"UPWELL_POOLS.{spec.name}.options.time: {limit!r} is not a Slurm time "
                              "(minutes, [D-]HH:MM:SS)")
        lines.append(f"--time={limit}")
    if spec.options.get("exclusive") and nodes <= 1:
        lines.append("--exclusive")
    output = spec.options.get("output")
    if output:
        lines.append(f"--output={output}")
    return lines


def agent_env(spec: PoolSpec, *, idle_exit_s: float, state_dir: str | None = None,
              spot: bool = False, nodes: int = 1) -> dict[str, str]:
    """What the agent needs beyond the submitter's environment: settings, never a key."""
    from upwell.pools.azure_common import agent_env as cloud_env

    env = {"UPWELL_POOL": spec.name, "UPWELL_VM_SIZE": spec.vm_size,
           "UPWELL_NODE_SPOT": "1" if spot or spec.options.get("spot") else "0",
           "UPWELL_IDLE_EXIT_S": f"{idle_exit_s:g}", "PYTHONUNBUFFERED": "1"}
    if nodes > 1:  # a gang: the payload's ranks start through srun --mpi=pmix over the whole allocation
        env[GANG_ENV] = str(nodes)
    else:
        # The payload's mpiexec runs its ranks on this node, inside the agent's step: it must not read the
        # allocation (one task) or launch its daemons through a nested srun, which would hang.
        env.update({"PRTE_MCA_plm": "^slurm", "PRTE_MCA_ras": "^slurm", "OMPI_MCA_plm": "^slurm",
                    "OMPI_MCA_ras": "^slurm"})
    if spec.options.get("apptainer"):
        env[APPTAINER_ENV] = "1"
    env.update(cloud_env(spec))
    if state_dir:
        env["UPWELL_SLURM_STATE_DIR"] = str(state_dir)
    return env


def batch_script(spec: PoolSpec, *, idle_exit_s: float = 120.0, state_dir: str | None = None,
                 python: str | None = None, workdir: str | None = None, spot: bool = False, nodes: int = 1) -> str:
    """The sbatch script that runs one agent. ``state_dir``: where agents write their state
    (idle/running) for the pool to read, when the pool and the nodes share a file system. ``nodes`` > 1:
    a gang job (see the module docstring)."""
    python = str(spec.options.get("python") or python or sys.executable)
    workdir = str(spec.options.get("workdir") or workdir or REPO)
    q = shlex.quote
    env = agent_env(spec, idle_exit_s=idle_exit_s, state_dir=state_dir, spot=spot, nodes=nodes)
    agent = [q(python), "-m", "workers.agent", "--pool", q(spec.name), "--idle-exit", q(f"{idle_exit_s:g}")]
    extra = [q(a) for a in _list(spec, "srun_args")]
    if nodes > 1:  # the batch step itself (see the module docstring); its payload is the job's step
        command, ranks = agent, []
        why = "# upwell gang agent: the batch step; the payload's srun --mpi=pmix is the job's step."
    else:
        # The ranks an MPI payload gets: what this allocation gave the agent's task (the node, if exclusive).
        cpus = "${SLURM_CPUS_ON_NODE:-1}" if spec.options.get("exclusive") else "${SLURM_CPUS_PER_TASK:-1}"
        command = ["srun", "--ntasks=1", '--cpus-per-task="$UPWELL_RANKS"', "--kill-on-bad-exit=1", *extra, *agent]
        ranks = [f'export UPWELL_RANKS="{cpus}"']
        why = "# upwell agent: one per job; srun makes it a job step, so Slurm's signals reach it."
    lines = ["#!/bin/bash", *(f"#SBATCH {d}" for d in directives(spec, spot=spot, nodes=nodes)), why,
             "set -eu", *(f"export {k}={q(v)}" for k, v in sorted(env.items())),
             f'export UPWELL_NODE_ID="slurm-{spec.name}-$SLURM_JOB_ID"',
             *ranks,
             'if [ -n "${UPWELL_SLURM_STATE_DIR:-}" ]; then',
             f'  mkdir -p "$UPWELL_SLURM_STATE_DIR/{spec.name}"',
             f'  export UPWELL_STATE_FILE="$UPWELL_SLURM_STATE_DIR/{spec.name}/$SLURM_JOB_ID.json"',
             "fi",
             f"cd {q(workdir)}",
             "exec " + " ".join(command), ""]
    return "\n".join(lines)


APPTAINER_ENV = "UPWELL_APPTAINER"  # set on the agent where the pool runs payloads through apptainer


def apptainer_exec(image: str, *, gpus: int = 0, binds: tuple[str, ...] = ()) -> list[str]:
    """The prefix that runs an argv inside a definition's image with Apptainer (the container runtime of
    most HPC and CycleCloud Slurm clusters, which rarely allow Docker): ``apptainer exec`` of the image by
    its digest, ``docker://<repo>@sha256:<digest>`` (a tag would let the image change under a shard),
    ``--nv`` where the shard has GPUs (the host's NVIDIA driver and devices bound in), ``--bind`` for each
    folder the payload reads and writes (its work dir; Apptainer binds $HOME, /tmp and the cwd only), and no
    ``--cleanenv``, so that the MPI and Slurm variables reach the ranks. Followed: the apptainer-exec manual
    page (the ``docker://`` source, ``-B/--bind src[:dest]``, ``--nv``)."""
    from upwell.payloads.definition import DIGEST

    if not DIGEST.match(image):
        raise ConfigError(f"apptainer runs images pinned by digest (<repo>@sha256:<64 hex>), got {image!r}")
    argv = ["apptainer", "exec"]
    if gpus:
        argv.append("--nv")
    for folder in binds:
        argv += ["--bind", folder]
    return [*argv, f"docker://{image}"]


def sbatch_argv(spec: PoolSpec) -> list[str]:
    """sbatch reads the script on stdin; --parsable prints ``<job id>[;cluster]``."""
    return ["sbatch", "--parsable", *_list(spec, "sbatch_args")]


def squeue_argv(spec: PoolSpec) -> list[str]:
    """The pool's jobs in every state Slurm still remembers (finished ones for MinJobAge)."""
    return ["squeue", "--noheader", "--states=all", f"--name={job_name(spec)}", f"--format={SQUEUE_FORMAT}"]


def scancel_argv(job_ids: list[str], *, signal: str | None = None, batch: bool = False) -> list[str]:
    """Cancel jobs, or (``signal``) send a signal to their steps, i.e. the agent; ``batch``: to the batch
    step instead (a gang's agent)."""
    return ["scancel", *(["--batch"] if batch else []), *([f"--signal={signal}"] if signal else []), *job_ids]


def parse_job_id(out: str) -> str:
    """``sbatch --parsable`` prints ``<id>`` or ``<id>;<cluster>``."""
    first = out.strip().splitlines()[0] if out.strip() else ""
    job = first.split(";", 1)[0].strip()
    if not job.isdigit():
        raise ValueError(f"sbatch printed no job id: {out.strip()[:200]!r}")
    return job


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    state: str  # Slurm's long state name, upper case: PENDING, RUNNING, ...
    partition: str = ""
    nodes: str = ""
    reason: str = ""
    name: str = ""
    comment: str = ""
    size: int = 1  # its node count (squeue %D): k for a gang job, asked for while it pends


def parse_squeue(out: str, spec: PoolSpec) -> list[SlurmJob]:
    """Lines of SQUEUE_FORMAT; jobs of the same name that are not the pool's (another comment) are left out."""
    jobs = []
    for line in out.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", _SQUEUE_FIELDS - 1)
        if len(parts) != _SQUEUE_FIELDS:
            raise ValueError(f"squeue line has {len(parts)} fields, expected {_SQUEUE_FIELDS}: {line[:200]!r}")
        job_id, state, part, nodes, count, reason, name, note = (p.strip() for p in parts)
        if note != comment(spec) or name != job_name(spec):
            continue
        jobs.append(SlurmJob(job_id, state.split()[0].upper(), part, "" if nodes in ("(null)", "") else nodes,
                             "" if reason == "None" else reason, name, note, int(count) if count.isdigit() else 1))
    return jobs


# --- slurmrestd (OpenAPI v0.0.38, Slurm 22.05) -----------------------------------------------
# slurmrestd ignores #SBATCH lines: the job's options travel as fields beside the script.
REST_API = "v0.0.38"
_MEM = re.compile(r"^(\d+)([KMGT]?)B?$", re.IGNORECASE)


def time_minutes(limit: str) -> int:
    """A Slurm time ([D-]HH:MM:SS, MM:SS, MM or D-HH) in whole minutes, rounded up."""
    days, _, rest = limit.rpartition("-") if "-" in limit else ("0", "", limit)
    parts = [int(p) for p in rest.split(":")]
    if "-" in limit:
        h, m, s = (parts + [0, 0])[:3]
    else:
        h, m, s = ([0] * (3 - len(parts)) + parts) if len(parts) > 1 else (0, parts[0], 0)
        if len(parts) == 2:
            h, m, s = 0, parts[0], parts[1]
    return int(days or 0) * 1440 + h * 60 + m + (1 if s else 0)


def mem_mb(value: str) -> int:
    match = _MEM.match(value)
    if not match:
        raise ValueError(value)
    n, unit = int(match.group(1)), match.group(2).upper() or "M"
    return {"K": max(1, n // 1024), "M": n, "G": n * 1024, "T": n * 1024 * 1024}[unit]


def rest_job(spec: PoolSpec, script: str, env: dict[str, str], *, spot: bool = False,
             workdir: str | None = None, nodes: int = 1) -> dict:
    """The body of POST /slurm/v0.0.38/job/submit: the script and the same options as its #SBATCH lines.
    ``env`` is the job's whole environment (slurmrestd exports nothing of the caller's)."""
    job: dict = {"name": job_name(spec), "comment": comment(spec), **_rest_allocation(spec, nodes),
                 "signal": f"TERM@{_int(spec, 'signal_grace_s', DEFAULT_GRACE_S)}",
                 "requeue": bool(spec.options.get("requeue")),
                 "current_working_directory": str(spec.options.get("workdir") or workdir or REPO),
                 "environment": dict(env)}
    part = partition(spec, spot=spot)
    if part:
        job["partition"] = part
    for key, field in (("account", "account"), ("qos", "qos"), ("constraint", "constraints")):
        value = _text(spec, key)
        if value:
            job[field] = value
    job.update(_rest_limits(spec))
    if spec.options.get("exclusive") or nodes > 1:
        job["exclusive"] = "exclusive"
    if spec.options.get("gres"):
        raise ConfigError(f"UPWELL_POOLS.{spec.name}.options.gres is not supported through slurmrestd "
                          f"{REST_API}; use the command-line clients for GPU pools")
    if spec.options.get("output"):
        job["standard_output"] = str(spec.options["output"])
    return {"script": script, "job": job}


def _rest_allocation(spec: PoolSpec, nodes: int) -> dict:
    """``allocation``'s fields in a slurmrestd job body."""
    if nodes <= 1:
        return {"nodes": "1", "tasks": 1, "cpus_per_task": _int(spec, "cpus_per_task", 1, low=1)}
    per_node = _int(spec, "cores_per_node", 0)
    return {"nodes": str(nodes), **({"tasks_per_node": per_node} if per_node else {})}


def _rest_limits(spec: PoolSpec) -> dict:
    """The memory and time limits of a slurmrestd job body, where the pool sets them."""
    limits: dict = {}
    if _text(spec, "mem"):
        try:
            limits["memory_per_node"] = mem_mb(_text(spec, "mem") or "")
        except ValueError:
            raise ConfigError(f"UPWELL_POOLS.{spec.name}.options.mem must be a size like 4G") from None
    limit = _text(spec, "time")
    if limit and limit not in ("UNLIMITED", "INFINITE"):
        directives(spec)  # validates the time
        limits["time_limit"] = time_minutes(limit)
    return limits


def parse_rest_jobs(doc: dict, spec: PoolSpec) -> list[SlurmJob]:
    """GET /slurm/v0.0.38/jobs: the pool's jobs (same name and comment), as squeue would show them."""
    jobs = []
    for job in doc.get("jobs") or []:
        note = job.get("comment")
        note = note.get("job") if isinstance(note, dict) else note
        if job.get("name") != job_name(spec) or note != comment(spec):
            continue
        state = job.get("job_state")
        state = state[0] if isinstance(state, list) and state else state
        reason = str(job.get("state_reason") or "")
        count = job.get("node_count")
        jobs.append(SlurmJob(str(job.get("job_id")), str(state or "UNKNOWN").upper(), str(job.get("partition") or ""),
                             str(job.get("nodes") or ""), "" if reason == "None" else reason, job_name(spec),
                             comment(spec), int(count) if isinstance(count, int) and count > 0 else 1))
    return jobs
