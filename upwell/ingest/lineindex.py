"""Where the kept lines of a checked CSV block end, for the shard writer to cut between them.

``ArrayIndex`` holds every line end (and row number) in arrays: what a block with blank lines, rewritten cells
or a CR needs. ``CountedIndex`` is for a plain block, the common case: every line kept as it is, one row per
line. It keeps no array per line: it counts the LFs in windows of 64 KiB once (numpy's ``count_nonzero`` over
the block's LF mask), and finds a line's end only where the writer asks, at a shard's cut, by listing the LFs
of the one window that holds it. A 1 GB drop of 30-byte rows has 33 million lines and a few hundred cuts: the
arrays of line ends, row numbers and lengths that ``ArrayIndex`` needs cost about a second of CPU a GB, the
counts about a twentieth of that (bench/README.md, 2026-12-04).

Both answer in block offsets: ``end(k)`` is where line k ends (past its LF), ``below(t)`` how many lines end
before offset t, ``row(k)`` line k's row number; ``raw_end(k)`` where line k ends in the original blob, once
the caller has said where the block lies in it (``ranged``), and -1 where that is unknown.
"""

from __future__ import annotations

import copy

import numpy as np

WINDOW = 1 << 16


class ArrayIndex:
    """Every kept line's end and row number, and, with ``raw``, its end in the original."""

    def __init__(self, ends: np.ndarray, rows: np.ndarray, raw: np.ndarray | None = None) -> None:
        self.ends, self.rows, self.raw, self.n = ends, rows, raw, len(ends)

    def end(self, k: int) -> int:
        return int(self.ends[k])

    def row(self, k: int) -> int:
        return int(self.rows[k])

    def below(self, t: int) -> int:
        return int(np.searchsorted(self.ends, t, side="left"))

    def raw_end(self, k: int) -> int:
        return int(self.raw[k]) if self.raw is not None else -1

    def ranged(self, raw: np.ndarray) -> ArrayIndex:
        return ArrayIndex(self.ends, self.rows, raw)


class CountedIndex:
    """A plain block's lines: line k is row ``first_row + k`` and ends past the (k+1)-th LF. State: the block's
    bytes (a uint8 array), the running count of LFs at the end of each window, and (once ``ranged``) where the
    block starts in the original and where the original's bytes end (a last LF added to the block is not the
    original's). Each window's LF mask is made and dropped in turn: 64 KiB that the allocator reuses, where a
    mask of the whole block would be 4 MiB of fresh pages for every block."""

    def __init__(self, arr: np.ndarray, first_row: int) -> None:
        self.arr, self.first_row = arr, first_row
        counts = [np.count_nonzero(arr[a:a + WINDOW] == 10) for a in range(0, len(arr), WINDOW)]
        self.cum = np.cumsum(np.asarray(counts, dtype=np.int64))
        self.n = int(self.cum[-1]) if len(self.cum) else 0
        self.base, self.limit = -1, -1

    def end(self, k: int) -> int:
        w = int(np.searchsorted(self.cum, k + 1, side="left"))
        lo = w * WINDOW
        return lo + int(np.flatnonzero(self.arr[lo:lo + WINDOW] == 10)[k - self._before(w)]) + 1

    def row(self, k: int) -> int:
        return self.first_row + k

    def below(self, t: int) -> int:
        p = min(max(t - 1, 0), len(self.arr))  # a line ends before t when its LF is before t - 1
        w = p // WINDOW
        return self._before(w) + int(np.count_nonzero(self.arr[w * WINDOW:p] == 10))

    def raw_end(self, k: int) -> int:
        return min(self.base + self.end(k), self.limit) if self.base >= 0 else -1

    def arrays(self) -> ArrayIndex:
        """The same lines, every end listed (for a block whose ends in the original are not its own)."""
        return ArrayIndex(np.flatnonzero(self.arr == 10) + 1, self.first_row + np.arange(self.n))

    def ranged(self, base: int, limit: int) -> CountedIndex:
        """This index, with the block at ``base`` of the original, whose bytes end at ``limit``."""
        index = copy.copy(self)
        index.base, index.limit = base, limit
        return index

    def _before(self, w: int) -> int:
        return int(self.cum[w - 1]) if w else 0
