"""Checked CSV rows into shards: a copy (the header and the rows' bytes), or a byte range of the original.

With ``refs`` a shard whose every line was checked by the columnar reader is a range of the original blob
(``Shard.offset``, ``Shard.length``): the bytes from the end of the previous shard (or of the header) to the
end of its last line, blank lines between included; the agent normalises them as the copy would have been
(``upwell.shardref``). Rows that came through Python's csv module (quotes, UTF-16) are copies, and so is every
shard after them: their text was rewritten, so no range of the original holds it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from upwell.errors import InputRejected


@dataclass(frozen=True)
class Shard:
    index: int
    data: bytes  # the shard's CSV text; b"" for a range
    rows: int
    first_row: int  # row number of its first data row in the source (header = 1)
    offset: int = -1  # a range of the original: where it starts (-1: a copy, in data)
    length: int = 0
    header: bytes = b""  # a range's first line, as a copy would begin
    numeric: tuple[int, ...] = ()  # a range's columns whose missing-value cells are written NaN

    @property
    def is_range(self) -> bool:
        return self.offset >= 0


def raw_ends(raw: bytes, base: int) -> np.ndarray:
    """The end (past its terminator) of each line of ``raw``, ``base`` being where ``raw`` starts in the original:
    LF, CRLF and a lone CR end a line, as the columnar reader counts them; a last line without an end (the end
    of the input) ends at the end of ``raw``."""
    arr = np.frombuffer(raw, dtype=np.uint8)
    lf = arr == 10
    cr = arr == 13
    if cr.any():
        after = np.zeros_like(lf)
        after[:-1] = lf[1:]
        lf = lf | (cr & ~after)
    ends = np.flatnonzero(lf) + 1 + base
    if len(arr) and not lf[-1]:
        ends = np.append(ends, base + len(arr))
    return ends


class Writer:
    """Collects rows into shards: closes one at ``rows`` rows or once it reaches ``size`` bytes (header
    included). State: the header bytes, the open shard's pieces, its row count, size and first row; with
    ``refs``, where the open shard's range starts in the original (``pos``; -1 once it cannot be a range)
    and where its last line ends."""

    def __init__(self, head: bytes, rows: int | None, size: int | None, max_shards: int, source: str,
                 refs: bool = False, numeric: tuple[int, ...] = ()):
        self.numeric = numeric
        self.head, self.rows, self.size, self.max_shards, self.source = head, rows, size, max_shards, source
        self.parts: list[bytes | memoryview] = []
        self.count, self.bytes, self.first, self.index = 0, len(head), 0, 0
        self.refs, self.pos, self.end = refs, -1, -1

    def start_at(self, pos: int) -> None:
        """The rows start at ``pos`` of the original (the end of the header line): shards may be ranges."""
        self.pos = pos if self.refs else -1

    def row(self, text: bytes, rowno: int) -> Iterator[Shard]:
        """One row as rewritten text (Python's csv module): no range of the original holds it."""
        self.pos = -1
        if self.count == 0:
            self.first = rowno
        self.parts.append(text)
        self.count += 1
        self.bytes += len(text)
        if (self.rows and self.count >= self.rows) or (self.size and self.bytes >= self.size):
            yield self._close()

    def lines(self, data: bytes, index, ranged: bool) -> Iterator[Shard]:
        """Add checked lines: ``index`` (``lineindex``) says where each line of ``data`` ends and its row number,
        and, when ``ranged``, where it ends in the original (otherwise that is unknown, so no range)."""
        if not ranged:
            self.pos = -1
        view, k, n, start = memoryview(data), 0, index.n, 0
        while k < n:  # ``start``: where line k begins, the end of the lines taken before it
            if self.count == 0:
                self.first = index.row(k)
            take, full = n - k, False
            if self.rows and self.count + take >= self.rows:
                take, full = self.rows - self.count, True
            if self.size:
                reach = index.below(start + self.size - self.bytes) - k
                if reach < take:
                    take, full = reach + 1, True
            end = index.end(k + take - 1)
            self.parts.append(view[start:end])
            self.count += take
            self.bytes += end - start
            if ranged:
                self.end = index.raw_end(k + take - 1)
            k, start = k + take, end
            if full:
                yield self._close()

    def _close(self) -> Shard:
        if self.index + 1 > self.max_shards:
            raise InputRejected(f"{self.source} makes more than {self.max_shards} shards", field="shard",
                                limit=f"max_shards={self.max_shards}", source=self.source)
        if self.pos >= 0:
            shard = Shard(self.index, b"", self.count, self.first, self.pos, self.end - self.pos, self.head,
                          self.numeric)
            self.pos = self.end
        else:
            shard = Shard(self.index, b"".join([self.head, *self.parts]), self.count, self.first)
        self.index += 1
        self.parts, self.count, self.bytes = [], 0, len(self.head)
        return shard

    def finish(self, header_row: int) -> Iterator[Shard]:
        if self.count:
            yield self._close()
        elif self.index == 0:
            raise InputRejected(f"{self.source} has a header but no data rows", field="row", row=header_row + 1,
                                source=self.source)
