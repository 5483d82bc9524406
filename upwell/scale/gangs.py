"""Gangs in the scaling policy: shards of several nodes, counted in nodes. Pure.

A shard of ``k`` nodes (upwell.shape; k > 1 only on the gang backends, Slurm and Batch) runs as one
allocation of k whole nodes, so a backlog of 3 two-node shards wants 6 nodes whatever the pool's
``tasks_per_node``. (Followed: Azure Batch's "Use multi-instance tasks to run MPI applications" page: a
multi-instance task is one primary and numberOfInstances - 1 subtasks, one on each of the compute nodes
allocated to it; the gang pool runs ``taskSlotsPerNode = 1``. Slurm's ``sbatch -N k`` likewise holds k nodes
for the whole job.)

The policy (upwell.scale.policy) works in task slots (``tasks_per_node`` to a node); ``in_slots`` weighs each
k-node shard as k nodes' worth of slots, so that ceil(slots / tasks_per_node) is the
one-node shards' nodes plus k for each gang shard, and everything else the policy does (drain, activation,
episodes, budget, quota) sees nodes. ``allocations`` then says how many allocations of k nodes the target
holds, for ``WorkerPool.scale_to(gangs=)``.

``backlog`` is what the Autoscaler (and the simulation) observe: it splits the visible messages, the shards of
jobs being ingested and the running shards by the ``nodes`` of their job rows, which the Autoscaler reads once
per run anyway (no read per shard or per message).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Gang:
    """Shards of ``nodes`` nodes each (nodes > 1) on one pool: ``queued`` among the visible messages,
    ``announced`` among the shards of jobs still being ingested, ``running`` among the in-flight ones. Each
    count is also in the Observation's shard counts (visible, announced, in_flight), as one shard each."""

    nodes: int
    queued: int = 0
    announced: int = 0
    running: int = 0

    @property
    def waiting(self) -> int:
        """Shards not started: the visible ones, or the announced ones where more are announced than visible
        (the policy's prewarm takes the larger of the two, as for one-node shards)."""
        return max(self.queued, self.announced)


def extra_slots(gangs: Iterable[Gang], tasks_per_node: int, field: str) -> int:
    """Slots the gangs' shards take beyond the one each that the shard count already holds."""
    tpn = max(tasks_per_node, 1)
    return sum((g.nodes * tpn - 1) * max(getattr(g, field), 0) for g in gangs if g.nodes > 1)


def allocations(target: int, gangs: Iterable[Gang], singles_running_nodes: int) -> dict[int, int]:
    """{k: allocations of k nodes} that a target of ``target`` nodes holds: the running gangs first (their
    nodes are busy and the target keeps them), then the waiting ones, smaller gangs first (more shards start
    when the target is capped); the nodes of running one-node shards (``singles_running_nodes``) stay outside
    them. The gangs' nodes never exceed the target: the rest of it are one-node workers."""
    room = max(target - max(singles_running_nodes, 0), 0)
    out: dict[int, int] = {}
    ordered = sorted((g for g in gangs if g.nodes > 1), key=lambda g: g.nodes)
    for pick in (lambda g: g.running, lambda g: g.waiting):
        for g in ordered:
            take = min(max(pick(g), 0), room // g.nodes)
            if take:
                out[g.nodes] = out.get(g.nodes, 0) + take
                room -= take * g.nodes
    return out


def backlog(visible: int, active: Iterable, ingesting: Iterable, running_jobs: Iterable[str]) -> tuple[Gang, ...]:
    """The gangs of one pool from what the Autoscaler read: ``active`` and ``ingesting`` job rows (anything
    with ``job_id``, ``nodes``, ``shards_total``, ``shards_done``, ``shards_failed``), the job ids of its
    running shard rows, and the visible message count.

    A job's shards still waiting are its total less those done, failed and running. The queue does not say
    whose its visible messages are, so the gangs' waiting shards are capped by ``visible`` (larger gangs
    first: a node short for a gang leaves the whole gang waiting) and the rest are one-node shards."""
    running: dict[str, int] = {}
    for job_id in running_jobs:
        running[job_id] = running.get(job_id, 0) + 1
    by_k: dict[int, list[int]] = {}  # k -> [waiting, announced, running]
    for j in active:
        k = _nodes(j)
        if k > 1:
            r = running.get(j.job_id, 0)
            acc = by_k.setdefault(k, [0, 0, 0])
            acc[0] += max(int(j.shards_total or 0) - int(j.shards_done or 0) - int(j.shards_failed or 0) - r, 0)
            acc[2] += r
    for j in ingesting:
        k = _nodes(j)
        if k > 1:
            by_k.setdefault(k, [0, 0, 0])[1] += max(int(j.shards_total or 0), 0)
    left = max(visible, 0)
    out = []
    for k in sorted(by_k, reverse=True):
        waiting, announced, run = by_k[k]
        queued = min(waiting, left)
        left -= queued
        out.append(Gang(k, queued, announced, run))
    return tuple(sorted(out, key=lambda g: g.nodes))


def as_mapping(allocs: Iterable[tuple[int, int]]) -> Mapping[int, int] | None:
    """A decision's allocations as ``scale_to``'s ``gangs`` keyword: None when there are none, so a backend
    without gangs is never handed an empty request it would have to read."""
    out = {int(k): int(m) for k, m in allocs if m > 0}
    return out or None


def _nodes(job) -> int:
    try:
        return max(int(getattr(job, "nodes", 1) or 1), 1)
    except (TypeError, ValueError):
        return 1
