"""This node as the rest of the system sees it: the node-level concerns of the agent.

Its identity (id, pool, VM size, spot), which every result records, and its state file, which the
local pool reads (``upwell.pools.process``): "running" with the shards in hand (``shard`` is the first),
"idle", or "stopped"; and its heartbeat into the nodes table (``upwell.nodelog``), written by ``Heartbeat`` from
the lease loop's ticks (each pass of the loop, and each lease tick while a payload runs) at most every
``beat_s``, and at once when the node's state changes. A node whose last shard just ended is not idle until the
loop's next receive comes back empty (``Node.idle``): between two batches it writes neither idle nor running
again. A periodic beat also reads whether the scaler marked the
node draining (``Node.draining``): the loop then takes no new work and, once it holds nothing, the last beat
says ``drained``, which lets the scaler remove the node by id.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from upwell.errors import UpwellError
from upwell.nodelog import NodeLog, NodeState, beat_row
from upwell.settings import env_int
from upwell.timeutil import now_iso


class Heartbeat:
    """Beats of one node. State: the state (and Scheduled Event types) last written and when (monotonic),
    whether this is the first beat, and the draining mark last read and when; one lock, as the slots and the
    loop tick from their own threads. A failed write is logged and tried again at the next tick: the work in
    hand never waits on it."""

    def __init__(self, log: NodeLog, pool: str, node: str, *, beat_s: float, vm_size: str = "", spot: bool = False,
                 nodes: int = 1, logger: Any = None, clock=time.monotonic) -> None:
        self.log, self.pool, self.node, self.beat_s, self.nodes = log, pool, node, beat_s, nodes
        self.vm_size, self.spot, self.logger, self.clock = vm_size, spot, logger, clock
        self.started_at = now_iso()
        self.draining = False
        self._last: tuple[NodeState, str] | None = None
        self._last_at = self._read_at = float("-inf")
        self._first = True
        self._lock = threading.Lock()

    def beat(self, state: NodeState, shards: list[str], *, force: bool = False, event: str = "") -> bool:
        """Write the node's state if it or the events it waits out (``event``: a Scheduled Event's types, which
        IMDS may add to while the node waits) changed, if ``force``, or if ``beat_s`` has passed since the last
        write; read the draining mark when ``beat_s`` has passed since the last read (a busy agent whose state
        changes often still reads it). Returns whether the node is marked draining."""
        with self._lock:
            now = self.clock()
            try:
                if not self._first and now - self._read_at >= self.beat_s:
                    row = self.log.get(self.pool, self.node)
                    self.draining, self._read_at = bool(row and row.draining), now
                if self.draining and state is NodeState.RUNNING:
                    state = NodeState.DRAINING
                if not (force or (state, event) != self._last or now - self._last_at >= self.beat_s):
                    return self.draining
                self.log.beat(beat_row(self.pool, self.node, state, shards, started_at=self.started_at,
                                       vm_size=self.vm_size, spot=self.spot, nodes=self.nodes, event=event),
                              first=self._first)
            except UpwellError as exc:
                if self.logger is not None:
                    self.logger.warning("agent.beat_failed", error=str(exc).splitlines()[0][:200], code=exc.code)
                return self.draining
            if self._first:
                self._read_at = now
            self._last, self._last_at, self._first = (state, event), now, False
            return self.draining


class Node:
    """State: the shards in hand (message id -> "job/shard"), the state file, and whether the node is between
    batches (its last shard just ended and the loop has not yet heard the queue say it is empty), under one lock
    (the agent's slots share the node)."""

    def __init__(self, node_id: str, pool: str, *, vm_size: str = "local", spot: bool = False,
                 state_file: str = "", slots: int = 1, heartbeat: Heartbeat | None = None) -> None:
        self.id, self.pool, self.vm_size, self.spot = node_id, pool, vm_size, spot
        self.state_file, self.slots, self.heartbeat = state_file, max(1, slots), heartbeat
        self._lock = threading.Lock()
        self._running: dict[str, str] = {}
        self._between = False

    def describe(self) -> dict[str, Any]:
        """The node as a result document records it."""
        return {"id": self.id, "pool": self.pool, "vm_size": self.vm_size, "spot": self.spot}

    @contextmanager
    def holding(self, key: str, shard: str) -> Iterator[None]:
        """The state file says running (with this shard among those in hand) while the attempt runs."""
        with self._lock:
            self._running[key] = shard
            self._refresh_locked()
        self.tick()
        try:
            yield
        finally:
            with self._lock:
                self._running.pop(key, None)
                self._between = not self._running

    def refresh(self) -> None:
        """Write the state file as things stand: running with the shards in hand, or idle; beat if due."""
        with self._lock:
            self._refresh_locked()
        self.tick()

    def state(self, state: str) -> None:
        with self._lock:
            self._write(state)
            self._between = False
        self.tick()

    def idle(self) -> None:
        """The loop found the queue empty with nothing in hand: the node is idle now, and beats so."""
        with self._lock:
            self._between = False
        self.tick()

    @property
    def draining(self) -> bool:
        """The scaler marked this node draining (read at the last periodic beat)."""
        return self.heartbeat is not None and self.heartbeat.draining

    def tick(self) -> bool:
        """Beat if due (or if the state changed); whether the node is marked draining."""
        if self.heartbeat is None:
            return False
        with self._lock:
            shards = sorted(self._running.values())
            between = self._between and not shards
        if between:  # the loop is asking for more work: idle only once the queue says so (no idle-running pair
            return self.heartbeat.draining  # of writes between two batches)
        return self.heartbeat.beat(NodeState.RUNNING if shards else NodeState.IDLE, shards)

    def ticking(self, extend):
        """A lease tick that also beats: what a running payload's supervision calls every few seconds."""
        def tick() -> None:
            extend()
            self.tick()
        return tick

    def maintenance(self, kinds: list[str]) -> None:
        """The agent holds nothing and waits out a Scheduled Event of its VM (``workers.eviction.watched``):
        it beats ``maintenance`` with the events' types, at once and then every ``beat_s``, so its row says why
        it takes no work, and it is not taken for a node that exited."""
        if self.heartbeat is not None:
            self.heartbeat.beat(NodeState.MAINTENANCE, [], event=",".join(kinds))

    def stopped(self, *, drained: bool) -> None:
        """The loop has returned and nothing is in hand: the state file says stopped, and the last beat says
        ``drained`` (asked to drain: the node may be removed now) or ``stopped`` (idle exit, preemption)."""
        with self._lock:
            self._write("stopped")
        if self.heartbeat is not None:
            self.heartbeat.beat(NodeState.DRAINED if drained else NodeState.STOPPED, [], force=True)


    def _refresh_locked(self) -> None:
        shards = sorted(self._running.values())
        if shards:
            self._write("running", shard=shards[0], shards=shards, slots=self.slots)
        else:
            self._write("idle")

    def _write(self, state: str, **extra) -> None:
        if not self.state_file:
            return
        path = Path(self.state_file)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "state": state, "since": time.time(),
                                   "node": self.id, **extra}))
        os.replace(tmp, path)


def heartbeat(storage: Any, config: Any, logger: Any) -> Heartbeat:
    """The agent's heartbeat into the nodes table of ``storage``, at ``config.beat_s``. A gang agent stands for
    its allocation's k nodes (``UPWELL_GANG_NODES``, the gang contract's variable, set by its pool), so the
    scaler counts nodes, as its target does."""
    nodes = env_int(os.environ, "UPWELL_GANG_NODES", 1, minimum=1)
    return Heartbeat(NodeLog(storage), config.pool, config.node_id, beat_s=config.beat_s, vm_size=config.vm_size,
                     spot=config.spot, nodes=nodes, logger=logger)
