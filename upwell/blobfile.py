"""A blob at one pinned version as a seekable, read-only file: every read is one conditional ranged GET.

Parquet keeps its schema and row-group index in a footer at the end of the file, and each row group's
column chunks at offsets the footer names, so a reader that can seek reads a few ranges instead of the whole
blob. ``pyarrow.parquet.ParquetFile`` takes any Python file object with ``read``, ``seek`` and ``tell``
("source: str, pathlib.Path, pyarrow.NativeFile, or file-like object"; it reads the footer from the end, at
most 64 KiB at a time, and with ``pre_buffer=True`` coalesces a row group's column chunks into few reads).
Each ``read`` here is one Get Blob with ``x-ms-range`` and ``If-Match`` (the SDK's
``download_blob(offset, length, etag=..., match_condition=MatchConditions.IfNotModified)``, or ``version_id``
on a versioned account: a version is immutable), so every byte comes from the version pinned: a blob that
changed answers 412 (``Conflict``), one that is gone 404 (``NotFound``) (Blob service REST: "Get Blob",
"Specifying conditional headers for Blob service operations"). Those errors reach the caller as they are:
pyarrow raises the Python exception a file object's read raised."""

from __future__ import annotations

import os

from upwell.storage import Storage


class BlobFile:
    """``path`` (container/name) of ``size`` bytes as of ``etag`` (and ``version_id`` when set). State: the
    position, and what was read so far (``gets`` requests, ``read_bytes`` bytes), for the logs. It has what
    pyarrow's ``PythonFile`` uses of a readable file: ``read``, ``seek``, ``tell`` and ``closed`` (it holds no
    connection of its own, so it is never closed)."""

    closed = False

    def __init__(self, storage: Storage, path: str, *, size: int, etag: str, version_id: str = ""):
        self.storage, self.path, self.size = storage, path, size
        self.etag, self.version_id = etag, version_id
        self.pos = self.gets = self.read_bytes = 0

    @classmethod
    def pinned(cls, storage: Storage, path: str) -> BlobFile:
        """``path`` at its current version: one Get Blob Properties for the size, the ETag and the version id
        (NotFound when it is gone)."""
        props = storage.properties(path)
        return cls(storage, path, size=props.size, etag=str(props.etag),
                   version_id=str(getattr(props, "version_id", None) or ""))

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError(f"seek before the start of {self.path}")
        self.pos = base + offset
        return self.pos

    def read(self, size: int | None = -1) -> bytes:
        """Up to ``size`` bytes from the position (the rest of the blob for -1): one ranged GET, b"" at the end."""
        n = self.size - self.pos if size is None or size < 0 else min(size, self.size - self.pos)
        if n <= 0:
            return b""
        data = b"".join(self.storage.chunks(self.path, etag=self.etag, offset=self.pos, length=n,
                                            version_id=self.version_id or None))
        self.gets += 1
        self.read_bytes += len(data)
        self.pos += len(data)
        return data
