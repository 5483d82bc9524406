"""Shard blobs written in parallel while the reader goes on parsing, in order with the shards that
reference their input instead (``refer``: nothing to write).

Azurite and Blob Storage take many uploads at once; one at a time, ingest waits on each
round trip. At most ``depth`` shards are in flight, so memory stays bounded while the
input streams. The worker that uploads a shard also takes its SHA-256, off the reader's
thread. Leaving the ``with`` block waits for every upload and re-raises the first
failure (a transient storage error, so that the host redelivers the upload)."""

from __future__ import annotations

import hashlib
import queue
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from upwell.storage import Storage

WORKERS = 8


class ShardUploads:
    """Holds the executor, the futures in flight, and what was put: ``shards`` (after the ``with`` block) are
    the caller's rows, each ``(*row, path, sha256)``."""

    def __init__(self, storage: Storage, workers: int = WORKERS, depth: int = 2 * WORKERS):
        self.storage = storage
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="shard-upload")
        self.depth = depth
        self.pending: list[Future] = []
        self.rows: list[tuple[tuple, str, Future | dict]] = []

    def put(self, path: str, data: bytes, row: tuple = ()) -> None:
        while len(self.pending) >= self.depth:
            self.pending.pop(0).result()
        future = self.pool.submit(self._put, path, data)
        self.pending.append(future)
        self.rows.append((row, path, future))

    def _put(self, path: str, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        self.storage.write(path, data)
        return digest

    def refer(self, path: str, row: tuple, ref: dict) -> None:
        """A shard that references ``path`` (``ref``: its range, upwell.shardref): nothing to upload; it keeps
        its place among the others."""
        self.rows.append((row, path, ref))

    @property
    def shards(self) -> list[tuple]:
        """``(*row, path, sha256)`` for an upload; ``(*row, path, "", range)`` for a reference."""
        return [(*row, path, "", kept) if isinstance(kept, dict) else (*row, path, kept.result())
                for row, path, kept in self.rows]

    def __enter__(self) -> ShardUploads:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                for f in self.pending:
                    f.result()
        finally:
            for f in self.pending:
                f.cancel()
            self.pool.shutdown(wait=True)


_END = object()


def prefetch(chunks: Iterable[bytes], depth: int = 2) -> Iterator[bytes]:
    """Iterate ``chunks`` in a thread, up to ``depth`` ahead, so the download of the next chunk overlaps
    the parsing of this one. An error in the download is raised here, in the reader's thread. Two chunks of
    16 MiB (upwell.storage.CHUNK_GET_BYTES) hold as much ahead as four of the SDK's default 4 MiB did."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def pump() -> None:
        try:
            for chunk in chunks:
                if stop.is_set():
                    return
                q.put(chunk)
            q.put(_END)
        except BaseException as exc:  # noqa: BLE001 - handed to the reader
            q.put(exc)

    threading.Thread(target=pump, daemon=True, name="ingest-prefetch").start()
    try:
        while True:
            item = q.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while not q.empty():  # let a blocked pump see the stop
            q.get_nowait()
