"""Pure request builders for a gang pool's Batch job and its agent tasks: no I/O, tested on their own.

On a gang pool (``build_batch.is_gang_pool``) every agent runs as a Batch task in the pool's one job, so
Batch's scheduler alone hands out each node's one task slot (``taskSlotsPerNode`` = 1):

- a one-node agent is a plain task;
- the agent for shards of k > 1 nodes is a multi-instance task with ``numberOfInstances`` = k. Batch runs
  the coordination command on all k nodes (an sshd in the image, for the MPI's ssh launcher), then the
  application command (the agent, ``python -m workers.agent --pool <pool>`` with ``UPWELL_GANG_NODES`` = k)
  on the primary only; the agent launches its payload with mpirun over ``AZ_BATCH_HOST_LIST``
  (workers.gang). When the primary exits, Batch ends the subtasks.

Who holds the work item's lease: the agent inside the task, exactly as a one-node agent does (receive,
renew while the payload runs, delete once on a settled outcome, release on preemption). The task is
capacity only: Batch never sees a work item. A lost task (a node gone, a subtask failed, a spot eviction)
stops renewing, so the visibility timeout brings the item back for another agent; a finished item was
deleted once by the agent that settled it. Hence ``maxTaskRetryCount`` = 0: a failed task is not re-run
by Batch; the next scale run adds another if the backlog still wants one. An agent exits after
``idle_exit_s`` without work (the task completes; its nodes go idle and scale-in can take them).

Options read here (``UPWELL_POOLS.<pool>.options``, besides build_batch's): ``idle_exit_s`` (an agent
task's idle time before it exits, default 120), ``warm_idle_exit_s`` (the same for the one-node agents in
the first ``min_nodes`` slots; default 0, never) and ``coordination_command`` (default: the image's sshd).

Followed: "Use multi-instance tasks to run MPI applications in Batch" (primary and subtasks, coordination
command "launches a background service and verifies that [it] is ready", application command on the
primary only, the lifetime of the primary is the task's, ``AZ_BATCH_HOST_LIST``); the azure-batch 15.x
models ``BatchJobCreateOptions`` (``onAllTasksComplete``: "if a Job contains no Tasks, then all Tasks
are considered complete ... initially set onAllTasksComplete to noaction"), ``BatchTaskCreateOptions``
(``requiredSlots`` "for multi-instance Tasks, this must be 1"; task ids at most 64 characters,
case-insensitive) and ``MultiInstanceSettings``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from upwell.cost import tags as ops_tags
from upwell.pools import azure_common as az
from upwell.pools import build_batch as build
from upwell.pools.base import PoolSpec, warm_idle_exit_s, warm_wanted

# The image's sshd (workers/docker/gang-sshd.sh): started on every node of the task, ready before it returns.
SSHD_COORDINATION = "/bin/sh /app/workers/docker/gang-sshd.sh"
IDLE_EXIT_S = 120.0  # an agent task ends after this long without work (the same default as the Slurm pool)
# Tasks that hold or wait for nodes: these count as allocations the pool has.
LIVE_STATES_FILTER = "state eq 'active' or state eq 'preparing' or state eq 'running'"
_TASK_ID = re.compile(r"^agent-n(?P<k>\d+)-s(?P<slot>\d+)-\d{8}T\d{4}$")


def job_id(spec: PoolSpec) -> str:
    """The pool's one Batch job: ``upwell-pool-<pool>`` (not ``upwell-<job>``, the ids of upwell jobs'
    Batch jobs that the janitor ends: build_batch.batch_job_id)."""
    return f"upwell-pool-{spec.name}"[:64]


def job_body(spec: PoolSpec) -> dict[str, Any]:
    """The Batch job (REST JSON of BatchJobCreateOptions) that holds the pool's agent tasks.

    ``onAllTasksComplete`` is ``noaction``, never ``terminatejob``: Batch counts a job with no tasks as
    having all its tasks complete, so ``terminatejob`` would end the job as it is created, before any task
    is added; and this job outlives each of its tasks (agents come and go with the backlog), so it is never
    patched to ``terminatejob`` either. It carries the pool's tags (no ``upwell-job`` tag: the janitor's
    orphan scan leaves it alone)."""
    return {"id": job_id(spec), "displayName": f"upwell {spec.name} agents",
            "poolInfo": {"poolId": build.pool_id(spec)},
            "onAllTasksComplete": "noaction", "onTaskFailure": "noaction", "usesTaskDependencies": False,
            "metadata": ops_tags.metadata(az.tags(spec))}


def wanted(n: int, gangs: Mapping[int, int] | None) -> dict[int, int]:
    """{k: how many agent tasks of k nodes} for n nodes of which ``gangs`` are wanted as allocations of k > 1.

    Gangs are counted within n, the largest first; a gang that no longer fits in n waits for a later
    evaluation; the nodes left over are one-node agents."""
    left, out = max(int(n), 0), {}
    for k, m in sorted(((int(k), int(m)) for k, m in (gangs or {}).items()), reverse=True):
        take = min(max(m, 0), left // k) if k > 1 else 0
        if take:
            out[k] = take
            left -= take * k
    if left:
        out[1] = left
    return out


def task_id(k: int, slot: int, now: datetime) -> str:
    """``agent-n<k>-s<slot>-<UTC minute>``: the same for the same wanted task within a minute (a second scale
    run that overlaps the first gets TaskExists, which is success), new after it (a completed task keeps its
    id in the job, so a later one for the same slot needs another)."""
    return f"agent-n{int(k)}-s{int(slot)}-{now.strftime('%Y%m%dT%H%M')}"


def parse_task_id(value: str) -> tuple[int, int] | None:
    """(k, slot) of an agent task's id; None for a task upwell did not add."""
    match = _TASK_ID.match(value or "")
    return (int(match["k"]), int(match["slot"])) if match else None


def agent_task(spec: PoolSpec, k: int, tid: str, *, warm: bool = False) -> dict[str, Any]:
    """The REST JSON of BatchTaskCreateOptions for one agent: a plain task (k = 1) or a multi-instance task
    of k nodes. Runs the pool's image as the image's user (build_batch.user_account), like the start task of
    a pool without gangs. ``warm``: one of the first ``min_nodes`` one-node agents (``is_warm``), whose idle
    exit is ``warm_idle_exit_s`` (default 0: never) instead of ``idle_exit_s``."""
    idle_s = warm_idle_exit_s(spec) if warm else float(spec.options.get("idle_exit_s", IDLE_EXIT_S))
    env = {"UPWELL_SLOTS": "1", "UPWELL_IDLE_EXIT_S": f"{idle_s:g}"}
    if k > 1:
        env["UPWELL_GANG_NODES"] = str(int(k))
    body: dict[str, Any] = {
        "id": tid,
        "displayName": f"upwell {spec.name} agent, {k} node{'s' if k > 1 else ''}",
        "commandLine": build.start_task_command(spec),
        "containerSettings": build.container_settings(spec, "taskWorkingDirectory"),
        "environmentSettings": build.agent_env(spec, **env),
        "userIdentity": {"username": build.AGENT_USER},
        # Capacity only: a failed task is not re-run by Batch (its item comes back through visibility).
        "constraints": {"maxTaskRetryCount": 0, "retentionTime": "P1D"},
        "requiredSlots": 1,
    }
    if k > 1:
        body["multiInstanceSettings"] = {"numberOfInstances": int(k),
                                         "coordinationCommandLine": coordination_command(spec)}
    return body


def is_warm(spec: PoolSpec, k: int, slot: int) -> bool:
    """Whether the agent task of ``k`` nodes in ``slot`` is warm: one-node agents in the first
    ``min_nodes`` slots are (slots are filled lowest first, and the surplus ends highest first)."""
    return k == 1 and slot < warm_wanted(spec, 0)


def coordination_command(spec: PoolSpec) -> str:
    """What every node of a gang runs first: ``options.coordination_command``, else the image's sshd (Open
    MPI, HPC-X and Intel MPI start their remote daemons over ssh)."""
    return str(spec.options.get("coordination_command") or SSHD_COORDINATION)
