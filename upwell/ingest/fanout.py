"""Fan-out of a big job: a grid's shards made lazily, and its work items sent concurrently within the
queue's limits.

``GridShards`` is a manifest's grid as a sized, re-iterable sequence of shards: its length comes from the
grid's dimensions, and each pass makes the points afresh (``manifests.iter_points``), so a sweep of 100,000
points is never a list of points, messages or rows. Ingest passes over it twice: once to check every point
and price the job before any shard row or message exists, once to write them.

``send_in_order`` sends the work items from a bounded window of threads, and reports progress in order
(every item before the mark has gone out), which is what the ingest's lease records as its resume point.
Followed: Queue Storage's scalability targets (learn.microsoft.com/azure/storage/queues/scalability-targets:
up to 2,000 messages per second for a single queue of 1 KiB messages, 20,000 per account), so the rate is
capped at ``enqueue_per_s`` (2,000 by default); past a target the service answers 503 "Server Busy",
which the SDK's retry policy backs off from.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from upwell.errors import InputRejected
from upwell.ingest import blocks, manifests


class GridShards:
    """A manifest's grid as shards ``(shard id, point, input blob, point sha256)``, made as they are read; the
    input blob is None, or every shard's one input (a chained job's parent results folder, upwell.after).
    With ``k`` > 1 each shard is a block of k consecutive points (upwell.ingest.blocks): ``(shard id, shared
    params, input blob, block sha256, None, [each point's own grid values])``. ``fit``: shrink k to what the
    first block's size says fits (``points_per_item: auto``). State: the manifest, the limits, the payload
    definition and k; ``len()`` (work items) and ``points`` need no pass."""

    def __init__(self, m: manifests.Manifest, max_shards: int, max_param_bytes: int, definition: Any, *,
                 input_blob: str | None = None, k: int = 1, fit: bool = False):
        self.manifest, self.max_param_bytes, self.definition = m, max_param_bytes, definition
        self.input_blob = input_blob
        self.k = max(1, int(k))
        if fit and self.k > 1:
            sample = list(itertools.islice(self._deltas(), self.k))
            self.k = min(self.k, blocks.fitting(sample))
        if self.k == 1:
            self.points = self.size = manifests.check_grid_size(m, max_shards)
            return
        self.points = manifests.grid_size(m.grid)
        self.size = -(-self.points // self.k)
        if self.size > max_shards:
            raise InputRejected(f"grid has {self.points} points in {self.size} blocks of {self.k}; the limit is "
                                f"{max_shards} shards per job", field="grid", limit=f"max_shards={max_shards}")

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[tuple]:
        if self.k > 1:
            yield from self._blocks()
            return
        for i, point in enumerate(manifests.iter_points(self.manifest, self.max_param_bytes, self.definition)):
            digest = hashlib.sha256(json.dumps(point, sort_keys=True).encode()).hexdigest()
            yield f"s{i:05d}", point, self.input_blob, digest

    def _deltas(self) -> Iterator[dict]:
        """Each point's own grid values, every point validated whole as a shard's would be."""
        keys = list(self.manifest.grid)
        for point in manifests.iter_points(self.manifest, self.max_param_bytes, self.definition):
            yield {key: point[key] for key in keys}

    def _blocks(self) -> Iterator[tuple]:
        shared, deltas = dict(self.manifest.params), self._deltas()
        for b in itertools.count():
            chunk = list(itertools.islice(deltas, self.k))
            if not chunk:
                return
            sid = f"s{b:05d}"
            text = blocks.check(sid, chunk)  # BlockTooLarge before any row or message exists
            digest = hashlib.sha256(json.dumps([shared, text], sort_keys=True).encode()).hexdigest()
            yield sid, shared, self.input_blob, digest, None, chunk


class Pacer:
    """At most ``per_s`` starts a second across threads (0: no cap). State: the next free slot."""

    def __init__(self, per_s: float, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.gap = 1.0 / per_s if per_s > 0 else 0.0
        self.clock, self.sleep = clock, sleep
        self.next = 0.0
        self.lock = threading.Lock()

    def wait(self) -> None:
        if not self.gap:
            return
        with self.lock:
            now = self.clock()
            slot = max(self.next, now)
            self.next = slot + self.gap
        if slot > now:
            self.sleep(slot - now)


def send_in_order(items: Iterable[tuple[int, Any]], send: Callable[[int, Any], None],
                  progress: Callable[[int], None], *, workers: int, per_s: float) -> int:
    """``send(i, item)`` for each ``(i, item)`` of ``items`` (ascending ``i``; made as they are taken),
    ``workers`` at a time and at most ``per_s`` a second; after each completes, in order,
    ``progress(i + 1)``: every index before it has gone out. A failure (a send's error, or ``progress``
    raising: a lost lease) sends no more and is raised. How many were sent."""
    pacer = Pacer(per_s)

    def paced(i: int, item: Any) -> None:
        pacer.wait()
        send(i, item)

    window: deque[tuple[int, Future]] = deque()
    sent, depth = 0, 4 * max(1, workers)  # bounded: a few items per thread are in hand at any time
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="enqueue") as pool:
        try:
            for i, item in items:
                window.append((i, pool.submit(paced, i, item)))
                if len(window) >= depth:
                    sent += _settle(window.popleft(), progress)
            while window:
                sent += _settle(window.popleft(), progress)
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise
    return sent


def _settle(entry: tuple[int, Future], progress: Callable[[int], None]) -> int:
    i, future = entry
    future.result()
    progress(i + 1)
    return 1
