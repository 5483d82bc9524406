"""Shard blobs written in parallel while the reader goes on parsing.

Azurite and Blob Storage take many uploads at once; one at a time, ingest waits on each
round trip. At most ``depth`` shards are in flight, so memory stays bounded while the
input streams. Leaving the ``with`` block waits for every upload and re-raises the first
failure (a transient storage error, so that the host redelivers the upload)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from upwell.storage import Storage

WORKERS = 8


class ShardUploads:
    """Holds the executor, the futures in flight, and ``shards``: the caller's rows for what was put."""

    def __init__(self, storage: Storage, workers: int = WORKERS, depth: int = 2 * WORKERS):
        self.storage = storage
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="shard-upload")
        self.depth = depth
        self.pending: list[Future] = []
        self.shards: list[tuple] = []

    def put(self, path: str, data: bytes) -> None:
        while len(self.pending) >= self.depth:
            self.pending.pop(0).result()
        self.pending.append(self.pool.submit(self.storage.write, path, data))

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


def prefetch(chunks: Iterable[bytes], depth: int = 4) -> Iterator[bytes]:
    """Iterate ``chunks`` in a thread, up to ``depth`` ahead, so the download of the next chunk overlaps
    the parsing of this one. An error in the download is raised here, in the reader's thread."""
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
