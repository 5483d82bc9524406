"""The columnar reader's Arrow path on drops cut as a download cuts them: types are checked by Arrow's typed
parse, a bad value sends only its own block to the exact checker (which names the row, column and value), and
the shards' byte ranges are the ones a line-by-line reading of the same bytes gives."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from upwell.errors import InputRejected
from upwell.ingest import csvblocks
from upwell.ingest.rawblocks import Pieces
from upwell.ingest.sharding import shard_csv

COLUMNS = {"t": "float", "n": "int", "label": "str"}
MB = 1 << 20


def _chunks(data: bytes, size: int) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


def _reference(raw: bytes, per: int) -> list[tuple[int, int, int, int]]:
    """(offset, length, rows, first row) of each shard, read line by line: a line ends at LF, CRLF or CR; the
    header is line 1; blank lines count as rows of the file but hold none; a shard's range runs from where the
    previous one ended (the header's end first) to the end of its last row."""
    ends = [m.end() for m in re.finditer(rb"\r\n|\r|\n", raw)]
    if not ends or ends[-1] < len(raw):
        ends.append(len(raw))
    shards, start, count, first, last = [], ends[0], 0, 0, 0
    for k in range(1, len(ends)):
        if not raw[ends[k - 1]:ends[k]].rstrip(b"\r\n"):
            continue
        first, count, last = first or k + 1, count + 1, ends[k]
        if count == per:
            shards.append((start, last - start, count, first))
            start, count, first = last, 0, 0
    if count:
        shards.append((start, last - start, count, first))
    return shards


def _ranges(raw: bytes, size: int, per: int) -> list[tuple[int, int, int, int]]:
    shards = list(shard_csv(_chunks(raw, size), source="t.csv", rows_per_shard=per, columns=COLUMNS, refs=True))
    assert all(s.is_range for s in shards)
    return [(s.offset, s.length, s.rows, s.first_row) for s in shards]


_ROW = st.tuples(st.floats(allow_nan=False, allow_infinity=False).map(repr), st.integers(-10**9, 10**9).map(str),
                 st.text(alphabet="abc xyz-", max_size=5))


@settings(max_examples=80, deadline=None)
@given(rows=st.lists(st.one_of(_ROW, st.none()), min_size=1, max_size=120), end=st.sampled_from(["\n", "\r\n", "\r"]),
       last_end=st.booleans(), per=st.integers(1, 25), size=st.integers(1, 700))
def test_ranges_are_those_of_a_line_by_line_reading(rows, end, last_end, per, size):
    if all(r is None for r in rows):
        rows = [*rows, ("1.5", "2", "x")]
    lines = ["t,n,label"] + ["" if r is None else ",".join(r) for r in rows]
    raw = (end.join(lines) + (end if last_end else "")).encode()
    assert _ranges(raw, size, per) == _reference(raw, per)


@pytest.mark.parametrize("end", ["\n", "\r\n"])
@pytest.mark.parametrize("last_end", [True, False])
@pytest.mark.parametrize("size", [500, 4096, 1 << 20])
def test_ranges_of_a_drop_over_many_blocks(end, last_end, size):
    """Many blocks after the header's, the last one ending with or without a line end."""
    raw = _drop(3000).replace(b"\n", end.encode())
    raw = raw if last_end else raw[:-len(end)]
    assert _ranges(raw, size, 700) == _reference(raw, 700)


def _drop(rows: int, bad_at: int | None = None) -> bytes:
    body = b"".join(b"%d.25,%d,s%d\n" % (i, i % 1000 - 500, i % 7) for i in range(rows))
    if bad_at is not None:
        body = body.replace(b"\n%d.25," % bad_at, b"\n%d.2.5," % bad_at, 1)
    return b"t,n,label\n" + body


def test_a_drop_in_download_sized_chunks_takes_the_typed_path_and_keeps_its_ranges(monkeypatch):
    """About 9 MB in 4 MiB chunks, as the Blob SDK yields them: every block is taken by Arrow's typed parse
    (the string read behind the exact checker never runs), and the ranges are the line-by-line ones."""
    reads = []
    monkeypatch.setattr(csvblocks, "_read", lambda *a: reads.append(a) or pytest.fail("exact path ran"))
    raw = _drop(500_000)
    assert len(raw) > 2 * 4 * MB
    assert _ranges(raw, 4 * MB, 100_000) == _reference(raw, 100_000)
    assert reads == []


def test_a_bad_value_sends_only_its_block_to_the_exact_checker_which_names_it(monkeypatch):
    typed, exact = [], []
    real_typed, real_read = csvblocks._typed_ok, csvblocks._read
    monkeypatch.setattr(csvblocks, "_typed_ok", lambda block, *a: typed.append(real_typed(block, *a)) or typed[-1])
    monkeypatch.setattr(csvblocks, "_read", lambda block, *a: exact.append(len(block)) or real_read(block, *a))
    raw = _drop(500_000, bad_at=499_000)
    assert raw.index(b"499000.2.5") > 2 * 4 * MB  # in the third block
    with pytest.raises(InputRejected) as err:
        list(shard_csv(_chunks(raw, 4 * MB), source="t.csv", rows_per_shard=100_000, columns=COLUMNS, refs=True))
    assert (err.value.row, err.value.field) == (499_002, "t")
    assert err.value.message == "t.csv: row 499002 column 't': '499000.2.5' is not float"
    assert [t >= 0 for t in typed] == [True, True, False]  # the clean blocks before it took the typed parse
    assert len(exact) == 1  # only the bad value's block was read as strings


def test_a_row_longer_than_arrows_block_is_parsed_again_with_room_for_it(monkeypatch):
    typed = []
    real = csvblocks._typed_ok
    monkeypatch.setattr(csvblocks, "_typed_ok", lambda block, layout, longest: typed.append(longest)
                        or real(block, layout, longest))
    monkeypatch.setattr(csvblocks, "_read", lambda *a: pytest.fail("exact path ran"))
    monkeypatch.setattr(csvblocks, "_ARROW_BLOCK", 1 << 20)  # a row over 4 MiB would take the default's place
    wide = ",".join(["\U0001f30a" * 70_000] * 9)  # 2.5 MB of UTF-8 in 630,000 characters, each field in csv's limit
    raw = f"t,n,a,b,c,d,e,f,g,h,i\n1.5,2,{',' * 8}\n2.5,3,{wide}\n3.5,4,{',' * 8}\n".encode()
    shards = list(shard_csv(_chunks(raw, 64 * 1024), source="t.csv", rows_per_shard=2,
                            columns={"t": "float", "n": "int"}, refs=True))
    assert [(s.offset, s.length, s.rows, s.first_row) for s in shards] == _reference(raw, 2)
    assert typed[-2:] == [0, len(wide.encode()) + 6]  # refused in Arrow's 1 MiB blocks, taken with room for the row


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=300).map(lambda b: b.translate(bytes.maketrans(b"\x00\x01\x02", b"\r\n,"))),
       sizes=st.lists(st.integers(1, 40), min_size=1, max_size=20))
def test_pieces_cut_at_the_last_line_end_held(data, sizes):
    """Each cut is every whole line held (the last LF, else the last CR that is not the final byte held), and the
    cuts and the rest put back together are the input."""
    pieces, held, out, pos, k = Pieces(), b"", [], 0, 0
    while pos < len(data):
        chunk = data[pos:pos + sizes[k % len(sizes)]]
        pos, k = pos + len(chunk), k + 1
        pieces.add(chunk)
        held += chunk
        cut = held.rfind(b"\n") + 1 or held.rfind(b"\r", 0, len(held) - 1) + 1
        raw = pieces.cut()
        assert raw == (held[:cut] if cut else None)
        if raw is not None:
            out.append(raw)
            held = held[cut:]
        assert pieces.size == len(held)
    assert b"".join(out) + pieces.take_all() == data


def test_a_quoted_record_with_newlines_is_never_split_by_a_range():
    """From the block that holds a quote on, rows go through Python's csv module as copies: no range ends
    inside the quoted record, and the ranges before it with the copies after it hold every row once."""
    head = _drop(2000)
    raw = head + b'7.5,1,"two\nlines, and a comma"\n8.5,2,z\n'
    shards = list(shard_csv(_chunks(raw, 1000), source="t.csv", rows_per_shard=300, columns=COLUMNS, refs=True))
    ranges = [s for s in shards if s.is_range]
    assert ranges and all(s.offset + s.length <= len(head) for s in ranges)
    assert [s.is_range for s in shards] == sorted((s.is_range for s in shards), reverse=True)
    assert shards[-1].data.endswith(b'7.5,1,"two\nlines, and a comma"\n8.5,2,z\n')
    assert sum(s.rows for s in shards) == 2002


@pytest.mark.parametrize("encoding, is_range", [("utf-8-sig", True), ("utf-16", False)])
def test_a_byte_order_mark_is_read_and_utf16_is_copied(encoding, is_range):
    """UTF-8 with a BOM is read in place (the ranges start after the BOM and the header); UTF-16 is decoded and
    its shards are copies, since no byte range of the original is UTF-8 text."""
    raw = _drop(50).decode().encode(encoding)
    shards = list(shard_csv(_chunks(raw, 64), source="t.csv", rows_per_shard=20, columns=COLUMNS, refs=True))
    assert [s.rows for s in shards] == [20, 20, 10] and all(s.is_range == is_range for s in shards)
    if is_range:
        assert [(s.offset, s.length, s.rows, s.first_row) for s in shards] == _reference(raw, 20)
    else:
        assert b"".join(s.data for s in shards).startswith(b"t,n,label\n0.25,-500,s0\n")


def test_utf16_without_a_byte_order_mark_is_a_named_error():
    with pytest.raises(InputRejected) as err:
        list(shard_csv([_drop(5).decode().encode("utf-16-le")], source="t.csv", columns=COLUMNS, refs=True))
    assert err.value.field == "encoding" and "UTF-16 text without a byte-order mark" in err.value.message
