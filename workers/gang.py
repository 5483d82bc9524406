"""A gang agent's allocation: its node count, its hosts, and the MPI launch over all of them.

The pools start a gang agent inside one allocation of k nodes with ``UPWELL_GANG_NODES=k`` (Slurm:
``sbatch --nodes=k``, upwell.pools.build_slurm; Batch: a multi-instance task of k instances) on its first
node, as the allocation's only agent. It takes only items of k nodes (``upwell.verdict`` defers the others)
and starts the payload's ranks over every node of the allocation:

- under Slurm (``SLURM_JOB_ID`` set): ``srun --mpi=pmix``, a step of the agent's job (the agent is its
  batch step, upwell.pools.build_slurm), with ``--nodes=k --ntasks=R --ntasks-per-node=r`` given
  explicitly (srun would otherwise take the counts the job's environment exports), ``--overlap`` (where a
  site runs the agent as a step itself), and ``--kill-on-bad-exit=0`` whatever the site's KillOnBadExit
  says: exit 75 is how ranks end after a checkpoint, and a rank that leaves first must not get its peers
  killed while rank 0 still writes it. Slurm's PMIx server wires the ranks (Open MPI's direct launch), and
  ``scancel``, preemption and a node taken away reach every rank. Followed: srun(1) of Slurm 22.05
  (--mpi, --overlap, --overcommit, --kill-on-bad-exit) and its MPI guide ("srun --mpi=pmix"); the hosts
  from ``scontrol show hostnames $SLURM_JOB_NODELIST``;
- on Azure Batch (``AZ_BATCH_HOST_LIST`` set): ``mpirun --host h1:r,h2:r -n R``, the hosts being the
  multi-instance task's nodes as Batch lists them, comma-separated, in the order of its instances
  (Batch's "Multi-instance tasks" and "Azure Batch runtime environment variables" pages).

``hosts`` and ``launch_argv`` are pure given the environment (and, for Slurm's node list, the command
that expands it); the launcher (workers.launch) and the runner (workers.runner) call ``launch_argv``.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Mapping

from upwell.errors import ConfigError
from upwell.pools.build_slurm import GANG_ENV, apptainer_exec
from upwell.settings import env_int
from upwell.shape import Shape

BATCH_HOSTS = "AZ_BATCH_HOST_LIST"


def gang_nodes(env: Mapping[str, str] | None = None) -> int:
    """The allocation's node count this agent serves (``UPWELL_GANG_NODES``); 1 for a one-node agent."""
    return env_int(os.environ if env is None else env, GANG_ENV, 1, minimum=1)


def expand_slurm(nodelist: str) -> list[str]:
    """``scontrol show hostnames`` of a Slurm node list (``n[1-2],gpu7``): one host a line."""
    try:
        done = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                              timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"scontrol show hostnames {nodelist}: {exc}") from None
    if done.returncode:
        raise ConfigError(f"scontrol show hostnames {nodelist}: {done.stderr.strip()[:300]}")
    return done.stdout.split()


def hosts(env: Mapping[str, str] | None = None, *,
          expand: Callable[[str], list[str]] = expand_slurm) -> list[str]:
    """The allocation's hosts, first (this agent's) first: Slurm's ``SLURM_JOB_NODELIST`` expanded, or
    Batch's ``AZ_BATCH_HOST_LIST``; [] outside an allocation (a one-node agent)."""
    env = os.environ if env is None else env
    if env.get("SLURM_JOB_NODELIST"):
        return expand(env["SLURM_JOB_NODELIST"])
    if env.get(BATCH_HOSTS):
        return [h.strip() for h in env[BATCH_HOSTS].split(",") if h.strip()]
    return []


def node_cores() -> int:
    """The cores of this node that the payload may use: Slurm's count for the allocation where it runs
    under Slurm, else the CPUs this process may run on."""
    slurm = os.environ.get("SLURM_CPUS_ON_NODE", "")
    if slurm.isdigit() and int(slurm) > 0:
        return int(slurm)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def launch_argv(shape: Shape, *, cores: int, env: Mapping[str, str] | None = None,
                host_list: list[str] | None = None, mpirun: str | Callable[[], str] = "mpirun") -> list[str]:
    """The prefix that starts ``shape.ranks`` ranks over the allocation's ``shape.nodes`` nodes (the
    program's argv follows it). ``cores``: one node's cores (the ranks' CPUs are shared out of them);
    ``mpirun``: the MPI launcher off Slurm (or what finds it). Raises ConfigError when the allocation has
    fewer hosts than the shape asks for."""
    env = os.environ if env is None else env
    per_node, total = shape.ranks_per_node, max(1, shape.ranks)
    if env.get("SLURM_JOB_ID"):
        argv = ["srun", "--mpi=pmix", f"--nodes={shape.nodes}", f"--ntasks={total}",
                f"--ntasks-per-node={per_node}", f"--cpus-per-task={max(1, cores // per_node)}",
                "--overlap", "--kill-on-bad-exit=0"]
        return argv + (["--overcommit"] if shape.oversubscribe else [])
    listed = host_list if host_list is not None else hosts(env)
    if len(listed) < shape.nodes:
        raise ConfigError(f"the allocation has {len(listed)} host(s) ({','.join(listed) or 'none'}); the shard "
                          f"asks for {shape.nodes} nodes")
    spread = ",".join(f"{h}:{per_node}" for h in listed[: shape.nodes])
    launcher = mpirun() if callable(mpirun) else mpirun
    return [launcher, "--host", spread, "-n", str(total), *(["--oversubscribe"] if shape.oversubscribe else [])]


def stopped_by_slurm(code: int | None, nodes: int, env: Mapping[str, str] | None = None) -> bool:
    """Whether a gang's launch ended because Slurm signalled its ranks: srun exits 128 + the signal that ended
    a task, and a SIGTERM there comes from Slurm (``scancel --signal=TERM``, the time limit's warning), which
    signals the job's steps, not the agent. Such an end is a preemption, never the payload's failure (a rank
    that had not yet installed its handler when the signal came dies of it instead of exiting 75)."""
    env = os.environ if env is None else env
    return nodes > 1 and code == 128 + signal.SIGTERM and bool(env.get("SLURM_JOB_ID"))


def container_prefix(image: str, gpus: int, workdir: str, *, apptainer: bool) -> list[str]:
    """Where the pool runs payloads through Apptainer (``apptainer``: the agent's setting, UPWELL_APPTAINER), the
    ``apptainer exec`` prefix of the definition's image by digest, after the launcher so that each rank runs
    in it; else []."""
    if not apptainer or not image:
        return []
    return apptainer_exec(image, gpus=gpus, binds=(workdir,))
