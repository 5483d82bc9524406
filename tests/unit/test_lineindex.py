"""Line indexes of a checked CSV block: the counted index of a plain block answers exactly as the array of every
line end would, across its 64 KiB windows, and the columnar reader takes the counted one only for plain blocks."""

from __future__ import annotations

import random

import numpy as np
import pytest

from upwell.errors import InputRejected
from upwell.ingest import csvblocks
from upwell.ingest.lineindex import WINDOW, ArrayIndex, CountedIndex
from upwell.ingest.sharding import shard_csv

LAYOUT = csvblocks.Layout(2, b",", ((0, "t", "float"), (1, "v", "float")), (), "src", (0, 1))


def _block(seed: int, lines: int, longest: int) -> bytes:
    rnd = random.Random(seed)
    return b"".join(f"{i},{'7' * rnd.randint(1, longest)}\n".encode() for i in range(lines))


@pytest.mark.parametrize(("seed", "lines", "longest"), [(1, 1, 3), (2, 40, 5000), (3, 9000, 40), (4, 300, 900)])
def test_counted_index_answers_as_the_array_of_every_line_end(seed, lines, longest):
    block = _block(seed, lines, longest)
    assert lines == 1 or len(block) > WINDOW  # all but the first span several windows
    arr = np.frombuffer(block, dtype=np.uint8)
    lf = arr == 10
    counted = CountedIndex(arr, 5)
    full = ArrayIndex(np.flatnonzero(lf) + 1, 5 + np.arange(lines))
    assert counted.n == full.n == lines
    assert [counted.end(k) for k in range(lines)] == [full.end(k) for k in range(lines)]
    assert [counted.row(k) for k in range(lines)] == [full.row(k) for k in range(lines)]
    probes = sorted({0, 1, 2, len(block) - 1, len(block), len(block) + 1, WINDOW - 1, WINDOW, WINDOW + 1,
                     *random.Random(seed).sample(range(len(block) + 2), min(400, len(block)))})
    assert [counted.below(t) for t in probes] == [full.below(t) for t in probes]
    ranged = counted.ranged(1000, 1000 + len(block) - 1)  # the original lacks the block's last LF
    assert counted.raw_end(0) == -1  # ranged is a copy
    assert [ranged.raw_end(k) for k in range(lines)] == [min(1000 + full.end(k), 1000 + len(block) - 1)
                                                         for k in range(lines)]
    arrays = counted.arrays()
    assert arrays.ends.tolist() == full.ends.tolist() and arrays.rows.tolist() == full.rows.tolist()


def test_plain_block_is_counted_and_others_are_listed():
    block = _block(7, 5000, 30)
    assert isinstance(csvblocks.check_block(block, 2, LAYOUT, 1 << 20).index, CountedIndex)
    blank = block.replace(b"\n", b"\n\n", 1)
    lines = csvblocks.check_block(blank, 2, LAYOUT, 1 << 20)
    assert isinstance(lines.index, ArrayIndex) and lines.count == 5001 and lines.index.n == 5000
    assert lines.index.row(1) == 4  # the blank line is row 3
    near = block.replace(b"\n", b"," + b"8" * 70_000 + b"\n", 1).replace(b",8", b"8", 1)  # a 70 KB field
    lines = csvblocks.check_block(near, 2, LAYOUT, 1 << 20)
    assert isinstance(lines.index, ArrayIndex) and lines.index.n == 5000


def test_a_long_line_is_refused_in_a_block_that_is_otherwise_plain():
    block = _block(8, 3000, 30)
    long = block.replace(b"\n", b"7" * 12_000 + b"\n", 1)
    with pytest.raises(InputRejected) as err:
        csvblocks.check_block(long, 2, LAYOUT, 10_000)
    assert "line 2 is longer than 10000 characters" in str(err.value)
    ok = block.replace(b"\n", b"7" * 9_000 + b"\n", 1)  # under the limit: checked by the listing path
    assert csvblocks.check_block(ok, 2, LAYOUT, 10_000).index.n == 3000


@pytest.mark.parametrize("cut", [{"rows_per_shard": 777}, {"bytes_per_shard": 50_000}])
def test_shards_cut_from_counted_blocks_match_the_rows(cut):
    rows = [f"{i},{i % 97 * 0.5}\n".encode() for i in range(60_000)]
    text = b"t,v\n" + b"".join(rows)
    chunks = [text[i:i + 300_000] for i in range(0, len(text), 300_000)]
    shards = list(shard_csv(chunks, source="s.csv", columns={"t": "float", "v": "float"}, refs=True, **cut))
    assert sum(s.rows for s in shards) == 60_000
    pos = len(b"t,v\n")
    for s in shards:
        assert s.is_range and s.offset == pos and s.first_row == int(text[pos:text.index(b",", pos)]) + 2
        body = text[s.offset:s.offset + s.length]
        assert body.count(b"\n") == s.rows and body.endswith(b"\n")
        if "rows_per_shard" in cut:
            assert s.rows == 777 or s is shards[-1]
        else:
            last = len(body) - body.rfind(b"\n", 0, len(body) - 1) - 1
            assert len(b"t,v\n") + s.length >= 50_000 or s is shards[-1]
            assert len(b"t,v\n") + s.length - last < 50_000
        pos += s.length
    assert pos == len(text)
