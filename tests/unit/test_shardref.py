"""Shards that reference the data: a range of the input, normalised by the agent, holds exactly what ingest's
copy of the same row block held (any line ends, blank lines, delimiter, missing values, chunking); a malformed
reference is a typed error."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from upwell.errors import DecodeError
from upwell.ingest.sharding import CsvOptions, shard_csv
from upwell.shardref import ShardRef, normalize

COLUMNS = {"a": "float", "b": "int", "c": "str"}
_cell_a = st.one_of(st.floats(allow_nan=False, allow_infinity=False).map(repr), st.just("NA"))
_cell_c = st.text(alphabet="xyz NA-_", max_size=6)
_row = st.tuples(_cell_a, st.integers(-10**6, 10**6).map(str), _cell_c)


def _chunks(data: bytes, size: int) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)] or [b""]


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.one_of(_row, st.just(None)), min_size=1, max_size=80), delim=st.sampled_from([",", ";", "\t"]),
       end=st.sampled_from(["\n", "\r\n", "\r"]), last_end=st.booleans(), per=st.integers(1, 9),
       size=st.integers(16, 4096), piece=st.integers(1, 64))
def test_a_range_normalised_is_the_copy(rows, delim, end, last_end, per, size, piece):
    if all(r is None for r in rows):
        rows = [*rows, ("1.0", "1", "x")]
    lines = [delim.join(["a", "b", "c"])] + ["" if r is None else delim.join(r) for r in rows]
    raw = (end.join(lines) + (end if last_end else "")).encode()
    options = CsvOptions(delim, "", ("NA",))
    copies = list(shard_csv(_chunks(raw, size), source="t", rows_per_shard=per, columns=COLUMNS, options=options))
    ranges = list(shard_csv(_chunks(raw, size), source="t", rows_per_shard=per, columns=COLUMNS, options=options,
                            refs=True))
    assert [(c.rows, c.first_row) for c in copies] == [(r.rows, r.first_row) for r in ranges]
    assert all(r.is_range and not r.data for r in ranges)
    assert all(a.offset + a.length == b.offset for a, b in zip(ranges, ranges[1:], strict=False))
    for copy, r in zip(copies, ranges, strict=True):
        ref = ShardRef(r.offset, r.length, "0x1", header=r.header.decode(), delimiter=delim, missing=("NA",),
                       numeric=r.numeric)
        ref = ShardRef.from_dict(ref.to_dict())  # as the work item carries it
        assert b"".join(normalize(_chunks(raw[r.offset:r.offset + r.length], piece), ref)) == copy.data


def test_quoted_rows_and_what_follows_them_are_copies():
    """The columnar reader checks the first blocks; from the block with a quote on, Python's csv module rewrites
    the rows, so those shards (the open one included) are copies."""
    head = b"".join(b"%d.0,%d,x\n" % (i, i) for i in range(300))
    raw = b"a,b,c\n" + head + b"3.0,3,\"q,z\"\n4.0,4,w\n"
    shards = list(shard_csv(_chunks(raw, 256), source="t", rows_per_shard=10, columns=COLUMNS, refs=True))
    kinds = [s.is_range for s in shards]
    assert kinds[0] and not kinds[-1] and kinds == sorted(kinds, reverse=True)
    assert shards[-1].data.endswith(b"3.0,3,\"q,z\"\n4.0,4,w\n") and shards[-1].data.startswith(b"a,b,c\n")
    assert sum(s.rows for s in shards) == 302


def test_a_whole_file_passes_as_it_is():
    ref = ShardRef(0, 7, "0x1")
    assert ref.whole and b"".join(normalize([b"\r\n\r\n", b"abc"], ref)) == b"\r\n\r\nabc"


@pytest.mark.parametrize("bad", ["{", "[]", {"offset": 1, "length": 2}, {"offset": -1, "length": 2, "etag": "e"},
                                 {"offset": 0, "length": 2, "etag": ""}, {"offset": 0, "length": 1, "etag": "e",
                                                                          "colour": 1}])
def test_a_malformed_range_is_a_decode_error(bad):
    with pytest.raises(DecodeError):
        ShardRef.from_dict(bad)
