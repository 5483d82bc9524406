"""Table ``nodes``: the heartbeats of the pools' agents and the scaler's drain marks; the one module that reads
and writes it, with typed rows.

One entity per node: PartitionKey = pool, RowKey = the agent's node id (``AZ_BATCH_NODE_ID`` on Batch, the VM
name on VMSS, the group name on ACI, ``local-<worker>`` locally), so a scale run reads one partition per pool.
Two writers share a row and never overwrite each other's fields (MERGE upserts):

- the agent (``workers.node``) writes ``state``, ``shards``, ``beat``/``beat_at`` and what it is; it only reads
  ``draining``, except on its first beat, which clears a mark left by an earlier agent of the same id;
- the scaler (``upwell.scale.nodes``) writes ``draining``/``drain_at``, and deletes a row once its node is gone.

``state`` is the agent's word: ``idle``, ``running``, ``draining`` (marked, still holding work), ``drained``
(marked, holding nothing, taking nothing: it may be removed), ``maintenance`` (on an Azure VM, holding nothing
and taking nothing while a Scheduled Event of its VM is listed, ``event`` naming its types: ``workers.eviction``)
or ``stopped`` (exited on its own). A row whose beat is older than ``Liveness.dead_after_s`` while its state
says the agent is alive is a dead agent. A ``maintenance`` row is not alive in that sense: it is no capacity,
and its node is going (Preempt, Terminate) or away for minutes (Reboot, Redeploy); once its beats stop for
``dead_after_s``, its row is forgotten as a ``stopped`` one is.
Every method raises only upwell errors (``storage_error``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from azure.core.exceptions import AzureError, ResourceNotFoundError
from azure.data.tables import UpdateMode

from upwell import names
from upwell.settings import env_float
from upwell.storage import Storage, storage_error
from upwell.timeutil import now_iso

BEAT_S = "UPWELL_BEAT_S"  # seconds between two periodic beats of an agent (a change of state beats at once)
DEAD_AFTER_S = "UPWELL_DEAD_AFTER_S"  # a beat older than this is a dead agent; default DEAD_AFTER_BEATS beats
DEAD_AFTER_BEATS = 3
RUN_TICK_S = 5.0  # a running payload's agent beats from the lease ticks (workers.payload_process.TICK_S)


class NodeState(str, Enum):
    IDLE = "idle"
    RUNNING = "running"
    DRAINING = "draining"
    DRAINED = "drained"
    STOPPED = "stopped"
    MAINTENANCE = "maintenance"


LIVE = (NodeState.IDLE, NodeState.RUNNING, NodeState.DRAINING)  # an agent that says it is there beats
QUIET = (NodeState.STOPPED, NodeState.MAINTENANCE)  # takes no work: its row is forgotten once silent for the dead age


@dataclass(frozen=True)
class Liveness:
    """How often agents beat, and how old a beat may be before its node counts as dead. The same two
    settings reach the agents (their environment) and the scale function (its app settings)."""

    beat_s: float = 30.0
    dead_after_s: float = 90.0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Liveness:
        """Read once; a bad value raises ConfigError naming the variable. The dead age is never under
        ``DEAD_AFTER_BEATS`` running beats (a busy agent beats only on its lease ticks)."""
        beat = env_float(env, BEAT_S, 30.0, minimum=0.05)
        floor = DEAD_AFTER_BEATS * max(beat, RUN_TICK_S)
        dead = env_float(env, DEAD_AFTER_S, floor, minimum=0.1)
        return cls(beat_s=beat, dead_after_s=dead)


@dataclass(frozen=True)
class NodeRow:
    """One node as its agent last said, and whether the scaler marked it draining. ``beat`` is epoch
    seconds (what ages are computed from); ``beat_at`` the same instant as an ISO time (for people)."""

    pool: str
    node: str
    state: NodeState = NodeState.IDLE
    shards: tuple[str, ...] = ()
    beat: float = 0.0
    beat_at: str = ""
    started_at: str = ""
    vm_size: str = ""
    spot: bool = False
    draining: bool = False
    drain_at: str = ""
    nodes: int = 1  # the allocation the agent stands for: k for a gang agent (UPWELL_GANG_NODES), else 1
    event: str = ""  # maintenance: the Scheduled Events' types it waits out, e.g. "Reboot"

    def age(self, now: float) -> float:
        return max(0.0, now - self.beat)

    def dead(self, now: float, liveness: Liveness) -> bool:
        """The agent says it is there, but has not beaten within ``dead_after_s``."""
        return self.state in LIVE and self.age(now) > liveness.dead_after_s

    def alive(self, now: float, liveness: Liveness) -> bool:
        return self.state in LIVE and not self.dead(now, liveness)

    @classmethod
    def from_entity(cls, entity: Any) -> NodeRow:
        """Coerces once: a missing or unknown property reads as its default."""
        try:
            state = NodeState(str(entity.get("state") or "idle"))
        except ValueError:
            state = NodeState.STOPPED
        shards = tuple(s for s in str(entity.get("shards") or "").split(",") if s)
        return cls(pool=entity["PartitionKey"], node=entity["RowKey"], state=state, shards=shards,
                   beat=float(entity.get("beat") or 0.0), beat_at=str(entity.get("beat_at") or ""),
                   started_at=str(entity.get("started_at") or ""), vm_size=str(entity.get("vm_size") or ""),
                   spot=bool(entity.get("spot")), draining=bool(entity.get("draining")),
                   drain_at=str(entity.get("drain_at") or ""), nodes=max(int(entity.get("nodes") or 1), 1),
                   event=str(entity.get("event") or ""))

    def beat_entity(self, *, first: bool) -> dict[str, Any]:
        """The agent's fields only (a MERGE keeps the scaler's); the first beat also clears ``draining``."""
        entity = {"PartitionKey": self.pool, "RowKey": self.node, "state": self.state.value,
                  "shards": ",".join(self.shards)[:4000], "beat": self.beat, "beat_at": self.beat_at,
                  "started_at": self.started_at, "vm_size": self.vm_size, "spot": self.spot, "nodes": self.nodes,
                  "event": self.event}
        if first:
            entity.update(draining=False, drain_at="")
        return entity


class NodeLog:
    """The ``nodes`` table of one storage account; keeps only the table client."""

    def __init__(self, storage: Storage) -> None:
        self.table = storage.table(names.NODES_TABLE)

    # -- the agent ----------------------------------------------------------------------------
    def beat(self, row: NodeRow, *, first: bool = False) -> None:
        try:
            self.table.upsert_entity(row.beat_entity(first=first), mode=UpdateMode.MERGE)
        except AzureError as exc:
            raise storage_error(exc, f"beat for node {row.node} of {row.pool}") from None

    # -- the scaler and the dashboard ---------------------------------------------------------------
    def get(self, pool: str, node: str) -> NodeRow | None:
        try:
            return NodeRow.from_entity(self.table.get_entity(pool, node))
        except ResourceNotFoundError:
            return None
        except AzureError as exc:
            raise storage_error(exc, f"read node {node} of {pool}") from None

    def nodes(self, pool: str) -> list[NodeRow]:
        """The pool's rows (its partition only), by node id; none when the table is not there yet."""
        try:
            rows = [NodeRow.from_entity(e) for e in self.table.query_entities("PartitionKey eq @p",
                                                                               parameters={"p": pool})]
        except ResourceNotFoundError:
            return []
        except AzureError as exc:
            raise storage_error(exc, f"read the nodes of {pool}") from None
        return sorted(rows, key=lambda r: r.node)

    def mark(self, pool: str, node_ids: Iterable[str], *, draining: bool = True) -> None:
        """Mark these nodes draining (or clear the mark); the agents read it at their next beat."""
        for node in node_ids:
            entity = {"PartitionKey": pool, "RowKey": node, "draining": draining,
                      "drain_at": now_iso() if draining else ""}
            try:
                self.table.upsert_entity(entity, mode=UpdateMode.MERGE)
            except AzureError as exc:
                raise storage_error(exc, f"mark node {node} of {pool} draining={draining}") from None

    def forget(self, pool: str, node: str) -> None:
        """Delete the row of a node that is gone (removed, or its agent exited long ago)."""
        try:
            self.table.delete_entity(pool, node)
        except ResourceNotFoundError:
            return
        except AzureError as exc:
            raise storage_error(exc, f"forget node {node} of {pool}") from None


def beat_row(pool: str, node: str, state: NodeState, shards: Iterable[str], *, started_at: str, vm_size: str,
             spot: bool, nodes: int = 1, event: str = "") -> NodeRow:
    """A beat of now: the row an agent writes."""
    return NodeRow(pool=pool, node=node, state=state, shards=tuple(shards), beat=time.time(), beat_at=now_iso(),
                   started_at=started_at, vm_size=vm_size, spot=spot, nodes=nodes, event=event)
