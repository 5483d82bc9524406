"""This node as the rest of the system sees it: the node-level concerns of the agent.

Its identity (id, pool, VM size, spot), which every result records, and its state file, which the
local pool reads (``upwell.pools.process``): "running" with the shards in hand (``shard`` is the first),
"idle", or "stopped". The node's heartbeat into the nodes table belongs here too.
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


class Node:
    """State: the shards in hand (message id -> "job/shard") and the state file, under one lock
    (the agent's slots share the node)."""

    def __init__(self, node_id: str, pool: str, *, vm_size: str = "local", spot: bool = False,
                 state_file: str = "", slots: int = 1) -> None:
        self.id, self.pool, self.vm_size, self.spot = node_id, pool, vm_size, spot
        self.state_file, self.slots = state_file, max(1, slots)
        self._lock = threading.Lock()
        self._running: dict[str, str] = {}

    def describe(self) -> dict[str, Any]:
        """The node as a result document records it."""
        return {"id": self.id, "pool": self.pool, "vm_size": self.vm_size, "spot": self.spot}

    @contextmanager
    def holding(self, key: str, shard: str) -> Iterator[None]:
        """The state file says running (with this shard among those in hand) while the attempt runs."""
        with self._lock:
            self._running[key] = shard
            self._refresh_locked()
        try:
            yield
        finally:
            with self._lock:
                self._running.pop(key, None)

    def refresh(self) -> None:
        """Write the state file as things stand: running with the shards in hand, or idle."""
        with self._lock:
            self._refresh_locked()

    def state(self, state: str) -> None:
        with self._lock:
            self._write(state)

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
