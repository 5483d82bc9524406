"""Streaming CSV sharding: exact partition of the rows, encodings, and named errors."""

import codecs
import csv
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from upwell.errors import InputRejected
from upwell.ingest.sharding import _RowText, shard_csv


def _csv(rows, header=("time", "a", "b"), newline="\n"):
    return (",".join(header) + newline + "".join(",".join(map(str, r)) + newline for r in rows)).encode()


def _chunks(data: bytes, size: int):
    return [data[i:i + size] for i in range(0, len(data), size)]


def _rows(shards):
    out = []
    for s in shards:
        rows = list(csv.reader(io.StringIO(s.data.decode())))
        assert rows[0] == ["time", "a", "b"]
        out += rows[1:]
    return out


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), per=st.integers(1, 50), chunk=st.integers(1, 97), crlf=st.booleans())
def test_shards_partition_rows_exactly(n, per, chunk, crlf):
    rows = [(i, i * 2, f"v{i}") for i in range(n)]
    data = _csv(rows, newline="\r\n" if crlf else "\n")
    shards = list(shard_csv(_chunks(data, chunk), source="t.csv", rows_per_shard=per))
    assert [tuple(map(str, r)) for r in rows] == [tuple(r) for r in _rows(shards)]
    assert all(s.rows <= per for s in shards) and sum(s.rows for s in shards) == n
    assert [s.first_row for s in shards] == [2 + i * per for i in range(len(shards))]


def test_split_by_size():
    data = _csv([(i, i, "x" * 50) for i in range(200)])
    shards = list(shard_csv([data], source="t.csv", bytes_per_shard=2048))
    assert len(shards) > 3 and all(len(s.data) < 2048 + 200 for s in shards)
    assert len(_rows(shards)) == 200


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16"])
def test_bom_and_utf16_accepted(encoding):
    text = "time,a,b\n1,2,3\n4,5,6\n"
    data = text.encode(encoding)
    assert data[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE) or data.startswith(codecs.BOM_UTF8)
    shards = list(shard_csv(_chunks(data, 3), source="t.csv", rows_per_shard=10))
    assert _rows(shards) == [["1", "2", "3"], ["4", "5", "6"]]


@pytest.mark.parametrize("data, field, row, text", [
    (b"", "document", 0, "empty"),
    (b"time,a,b\n", "row", 2, "no data rows"),
    (b"time,a,b\n1,2,3\n4,5\n", "row", 3, "row 3 has 2 fields"),
    (b"time,a,b\n1,2,3\n1,x,3\n", "a", 3, "'x' is not int"),
    (b"time,b\n1,2\n", "a", 1, "lacks required columns"),
    (b"time,a,b\n1,2,3\n1,2,\"3\n", "row", 3, "row 3: unexpected end of data"),
    (b"time,a,b\n1,\xff\xfe\xfd,3\n", "encoding", None, "not valid UTF-8"),
])
def test_bad_csv_names_the_problem(data, field, row, text):
    with pytest.raises(InputRejected) as err:
        list(shard_csv([data], source="t.csv", rows_per_shard=10, columns={"a": "int"}))
    assert text in err.value.message and err.value.field == field
    if row is not None:
        assert err.value.row == row


def test_huge_line_rejected_with_limit():
    data = b"time,a,b\n" + b"1,2," + b"9" * 5000 + b"\n"
    with pytest.raises(InputRejected) as err:
        list(shard_csv(_chunks(data, 100), source="t.csv", rows_per_shard=10, max_line=1000))
    assert err.value.limit == "max_line_bytes=1000"


def test_shard_limit():
    data = _csv([(i, i, i) for i in range(50)])
    with pytest.raises(InputRejected, match="more than 4 shards"):
        list(shard_csv([data], source="t.csv", rows_per_shard=10, max_shards=4))


def test_streams_without_loading_everything():
    """A generator source is consumed lazily: the first shard arrives before the input is exhausted."""
    consumed = []

    def source():
        yield b"time,a,b\n"
        for i in range(10_000):
            consumed.append(i)
            yield f"{i},{i},{i}\n".encode()

    first = next(iter(shard_csv(source(), source="t.csv", rows_per_shard=100)))
    assert first.rows == 100 and len(consumed) < 200


FIELD = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)


def _encode_rows(rows, header=("time", "a", "b"), newline="\n") -> bytes:
    """RFC 4180 text: a field with a comma, a quote, CR or LF is quoted (csv.writer leaves a lone CR bare)."""
    def field(f: str) -> str:
        return '"' + f.replace('"', '""') + '"' if any(c in f for c in ',"\r\n') else f
    return "".join(",".join(map(field, map(str, r))) + newline for r in [header, *rows]).encode()


@settings(max_examples=80, deadline=None)
@given(rows=st.lists(st.tuples(FIELD, FIELD, FIELD), min_size=1, max_size=60), per=st.integers(1, 20),
       chunk=st.integers(1, 64), crlf=st.booleans())
def test_quoted_fields_with_newlines_partition_exactly(rows, per, chunk, crlf):
    """Fields with commas, quotes, CR/LF and any other character (form feed, U+2028, NEL...) survive
    sharding unchanged, whatever the chunk boundaries: the shards hold exactly the input's rows."""
    data = _encode_rows(rows, newline="\r\n" if crlf else "\n")
    shards = list(shard_csv(_chunks(data, chunk), source="t.csv", rows_per_shard=per))
    got = [tuple(r) for s in shards for r in list(csv.reader(io.StringIO(s.data.decode(), newline="")))[1:]]
    assert got == [tuple(r) for r in rows]
    assert sum(s.rows for s in shards) == len(rows) and all(s.rows <= per for s in shards)


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 10**6), FIELD), min_size=1, max_size=80),
       limit=st.integers(1024, 4096), chunk=st.integers(1, 200))
def test_byte_size_shards_partition_exactly(rows, limit, chunk):
    """Sharding by size: the rows are partitioned exactly, and a shard closes at the first row that
    takes it to ``bytes`` (counted in UTF-8 bytes, header included), so each is under limit + a row."""
    rows = [(str(t), text, "x") for t, text in rows]
    data = _encode_rows(rows)
    shards = list(shard_csv(_chunks(data, chunk), source="t.csv", bytes_per_shard=limit))
    got = [tuple(r) for s in shards for r in list(csv.reader(io.StringIO(s.data.decode(), newline="")))[1:]]
    assert got == rows
    line = _RowText()  # how the sharder writes a row
    for s in shards[:-1]:
        last = len(line(list(rows[s.first_row - 2 + s.rows - 1])))
        assert len(s.data) >= limit and len(s.data) - last < limit
    assert len(shards[-1].data) <= limit + max(len(line(list(r))) for r in rows)


def test_byte_size_counts_bytes_not_characters():
    """Multi-byte text fills a size-limited shard by its encoded size."""
    data = _encode_rows([(i, "é" * 100, "x") for i in range(40)])  # 200 bytes but 100 characters per field
    shards = list(shard_csv([data], source="t.csv", bytes_per_shard=2048))
    assert all(len(s.data) < 2048 + 220 for s in shards) and sum(s.rows for s in shards) == 40


@pytest.mark.parametrize("char", ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"])
def test_only_cr_and_lf_end_lines(char):
    """str.splitlines() breaks at these; a CSV line does not."""
    data = f"time,a,b\n1,2,x{char}y\n".encode()
    [shard] = shard_csv([data], source="t.csv", rows_per_shard=10)
    assert _rows([shard]) == [["1", "2", f"x{char}y"]]


def test_huge_line_in_one_chunk_is_refused():
    """The line limit holds for a complete line inside one chunk, not only for an unfinished one."""
    data = b"time,a,b\n1,2," + b"9" * 5000 + b"\n3,4,5\n"
    with pytest.raises(InputRejected) as err:
        list(shard_csv([data], source="t.csv", rows_per_shard=10, max_line=1000))
    assert err.value.limit == "max_line_bytes=1000" and "line 2" in err.value.message


@pytest.mark.parametrize("data, kind", [(b"PK\x03\x04rest", "zip"), (b"\x1f\x8b\x08\x00", "gzip"),
                                        (b"BZh91AY", "bzip2"), (b"\xfd7zXZ\x00\x00", "xz")])
def test_archives_are_refused_by_content(data, kind):
    with pytest.raises(InputRejected, match=f"is a {kind} archive; archives are not accepted"):
        list(shard_csv([data + b"\n" * 10], source="t.csv"))
