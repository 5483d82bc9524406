"""The scaler's node step: dead agents, and drain before scale-in, by node id (issue 23, items 3 and 4).

The Autoscaler calls ``tend`` once per pool per run, after the policy decided its target and before
``scale_to``. From the pool's rows in the nodes table (``upwell.nodelog``, one partition read):

- a node whose agent says it is there but has not beaten within ``dead_after_s`` is dead: the pool removes it
  by id (``remove(dead=True)``); its work items come back when their leases lapse, and other agents take them;
- a node whose agent says ``drained`` (it was marked, holds nothing and takes nothing) is removed by id;
- a node whose agent says ``maintenance`` (it waits out a Scheduled Event of its VM, holding nothing) is not
  counted, not marked and not protected: it is no capacity while it waits, and a scale-in may take it; its row
  is forgotten once its beats have stopped for ``dead_after_s`` (the VM went, or its agent was stopped);
- while the agents alive and unmarked stand for more nodes than the target (a gang agent for its allocation's
  k), idle ones that the ledger does not show busy are marked draining (and signalled, where the backend can:
  ``drain``); while they stand for fewer (counting nodes still booting), marks not yet acted on are cleared;
- every node whose agent beats is returned as ``protected``: the caller adds it to the busy set it hands
  ``scale_to``, whose own scale-in (``upwell.pools.base``: idle nodes only, never one in busy) is then left
  with nodes that run no agent (booting, broken, dead, drained). A busy node is never removed here.

Only pools whose backend ``removes_by_id`` take part; for the others this step does nothing. A failing
removal is logged and its rows kept, so the next run tries again.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass

from upwell import logs
from upwell.errors import PoolError, UpwellError
from upwell.nodelog import QUIET, Liveness, NodeLog, NodeRow, NodeState
from upwell.pools.base import NodeState as PoolNodeState
from upwell.pools.base import PoolStatus, WorkerPool

log = logs.get("upwell.scale.nodes")


@dataclass(frozen=True)
class NodeStep:
    """What one run did to a pool's nodes, by id."""

    dead: tuple[str, ...] = ()  # removed: their agents stopped beating
    drained: tuple[str, ...] = ()  # removed: their agents drained
    marked: tuple[str, ...] = ()  # marked draining this run
    protected: frozenset[str] = frozenset()  # agents that beat: scale_to leaves them to the drain


def tend(pool: WorkerPool, nodelog: NodeLog, liveness: Liveness, status: PoolStatus, busy: Collection[str],
         target: int, now: float | None = None) -> NodeStep:
    """One pass over the pool's nodes (see the module docstring). Never raises: a storage failure is logged
    and nothing is protected this run (scale_to then keeps to the ledger's busy set, as without heartbeats)."""
    if not pool.removes_by_id:
        return NodeStep()
    try:
        return _tend(pool, nodelog, liveness, status, set(busy), target, time.time() if now is None else now)
    except UpwellError as exc:
        log.warning("nodes.step_failed", pool=pool.spec.name, error=str(exc)[:300], code=exc.code)
        return NodeStep()


def _tend(pool: WorkerPool, nodelog: NodeLog, liveness: Liveness, status: PoolStatus, busy: set[str],
          target: int, now: float) -> NodeStep:
    name = pool.spec.name
    rows = nodelog.nodes(name)
    dead = _remove(pool, nodelog, [r.node for r in rows if r.dead(now, liveness)], dead=True)
    drained = _remove(pool, nodelog, [r.node for r in rows if r.state is NodeState.DRAINED], dead=False)
    for row in rows:  # an agent that exited on its own long ago (idle exit, preemption), or whose VM went while it
        # waited out an event: its row only
        if row.state in QUIET and row.age(now) > liveness.dead_after_s:
            nodelog.forget(name, row.node)
    alive = [r for r in rows if r.alive(now, liveness)]
    marked = _drain_surplus(pool, nodelog, alive, target, status, busy)
    return NodeStep(dead=tuple(dead), drained=tuple(drained), marked=tuple(marked),
                    protected=frozenset(r.node for r in alive))


def _remove(pool: WorkerPool, nodelog: NodeLog, ids: list[str], *, dead: bool) -> list[str]:
    """Remove ``ids`` by id and forget their rows; none when the backend refused (kept for the next run)."""
    if not ids:
        return []
    try:
        pool.remove(ids, dead=dead)
    except PoolError as exc:
        log.warning("nodes.remove_failed", pool=pool.spec.name, nodes=ids, dead=dead, error=str(exc)[:300])
        return []
    for node in ids:
        nodelog.forget(pool.spec.name, node)
    log.info("nodes.removed", pool=pool.spec.name, nodes=ids, why="dead" if dead else "drained")
    return ids


def _drain_surplus(pool: WorkerPool, nodelog: NodeLog, alive: list[NodeRow], target: int, status: PoolStatus,
                   busy: set[str]) -> list[str]:
    """Mark idle, unmarked agents draining while they stand for more nodes than ``target`` (a gang agent
    for its k) and the backend sees more than ``target`` too; clear marks not yet acted on while they stand for
    fewer (counting nodes still booting). Returns the nodes marked now.

    The backend's count caps the rows' count: an agent that died without a last beat (its process killed, its
    VM taken) keeps a fresh-looking row until ``dead_after_s``, and must not make a live idle agent surplus."""
    name = pool.spec.name
    booting = status.count(PoolNodeState.PENDING)
    kept = [r for r in alive if not r.draining]
    surplus = min(sum(r.nodes for r in kept), status.alive) - target
    if surplus <= 0:
        short, undo = target - sum(r.nodes for r in kept) - booting, []
        for row in (r for r in alive if r.draining and r.state is NodeState.IDLE):
            if row.nodes <= short:
                undo.append(row.node)
                short -= row.nodes
        if undo:
            nodelog.mark(name, undo, draining=False)
            log.info("nodes.drain_cancelled", pool=name, nodes=undo)
        return []
    chosen = []
    for row in sorted(kept, key=lambda r: r.node, reverse=True):
        if row.state is NodeState.IDLE and row.node not in busy and not row.shards and row.nodes <= surplus:
            chosen.append(row.node)
            surplus -= row.nodes
    if chosen:
        nodelog.mark(name, chosen)
        pool.drain(chosen)
        log.info("nodes.draining", pool=name, nodes=chosen, target=target, alive=len(alive))
    return chosen
