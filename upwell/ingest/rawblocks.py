"""Downloaded chunks into blocks of whole lines, with one copy per block.

The columnar reader checks a CSV a block at a time; a block must end at a line end so that no row is
split between two checks. The chunks a download yields (16 MiB each, ``upwell.storage.CHUNK_GET_BYTES``) end
anywhere, so the unfinished line at the end of one is carried into the next block. ``Pieces`` keeps the chunks read
since the last cut as they came and joins them once, at the cut: the bytes are copied once on their way
from the download to Arrow, instead of growing one buffer (a copy per chunk) and slicing it (two more).

A line ends at LF, CRLF or a lone CR, as the reader counts them: the cut is after the last LF, or, where
the pieces hold no LF at all, after the last CR that is not the final byte (that one may be half of a CRLF
whose LF has not arrived yet).
"""

from __future__ import annotations


class Pieces:
    """Bytes read but not yet cut into a block. State: the pieces in order and their total size."""

    def __init__(self, first: bytes = b"") -> None:
        self.parts: list[bytes] = [first] if first else []
        self.size = len(first)

    def add(self, chunk: bytes) -> None:
        if chunk:
            self.parts.append(chunk)
            self.size += len(chunk)

    def joined(self) -> bytes:
        """Everything held, as one bytes (kept as the only piece)."""
        if len(self.parts) > 1:
            self.parts = [b"".join(self.parts)]
        return self.parts[0] if self.parts else b""

    def take_all(self) -> bytes:
        """Everything held (the end of the input): no line end needed."""
        raw = self.joined()
        self.parts, self.size = [], 0
        return raw

    def cut(self) -> bytes | None:
        """The whole lines at the front, up to the last line end; None when no line ends in what is held."""
        where = self._last(b"\n") or self._last(b"\r", skip_final=True)
        if where is None:
            return None
        i, end = where
        last = self.parts[i]
        raw = b"".join([*self.parts[:i], memoryview(last)[:end]]) if i or end < len(last) else last
        rest = [last[end:]] if end < len(last) else []
        self.parts = rest + self.parts[i + 1:]
        self.size = sum(len(p) for p in self.parts)
        return raw

    def _last(self, byte: bytes, skip_final: bool = False) -> tuple[int, int] | None:
        """(piece index, offset just past it) of the last ``byte`` held; with ``skip_final``, the final byte
        held does not count."""
        for i in range(len(self.parts) - 1, -1, -1):
            part = self.parts[i]
            stop = len(part) - 1 if skip_final and i == len(self.parts) - 1 else len(part)
            at = part.rfind(byte, 0, stop)
            if at >= 0:
                return i, at + 1
        return None
