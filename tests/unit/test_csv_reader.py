"""The columnar CSV reader against the row-by-row csv reader, and the rule options of real instrument CSVs.

Unquoted UTF-8 text goes through pyarrow and numpy (upwell.ingest.csvblocks); a quote hands over to
Python's csv module. Both must give the same shards and the same named errors (field, row), whatever
the values and however the input is cut into chunks.
"""

from __future__ import annotations

import csv
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from upwell.errors import InputRejected
from upwell.ingest.sharding import CsvOptions, _Sharder, shard_csv

COLUMNS = {"time": "float", "n": "int", "label": "str"}
# Values near the edge of what float() and int() accept: Arrow parses some that Python refuses.
VALUE = st.one_of(st.sampled_from(["1", "-0", "+1", "1.", ".5", "1e5", "1E+05", "nan", "-inf", "Infinity", "nan()",
                                   "0x1F", "1_0", " 1", "1 ", "\u0663", "", "e5", "1e999", "00.5", "n/a", "NaN"]),
                  st.integers(-10**20, 10**20).map(str), st.floats(allow_nan=False).map(repr),
                  st.text(alphabet="0123456789+-.eExXn()_ ", max_size=5))
ROW = st.tuples(VALUE, VALUE, st.text(alphabet="abc é", max_size=4), st.booleans())


def _chunks(data: bytes, size: int):
    return [data[i:i + size] for i in range(0, len(data), size)]


def _outcome(run):
    try:
        return [(s.index, s.data, s.rows, s.first_row) for s in run()]
    except InputRejected as exc:
        return (exc.message, exc.field, exc.row, exc.limit)


def _reference(data: bytes, per: int, options: CsvOptions = CsvOptions()):
    """The row-by-row reader alone (what every block with a quote goes through)."""
    sharder = _Sharder("t.csv", per, None, COLUMNS, 10_000, 1 << 20, options)
    return lambda: sharder._slow([data], rowno=0)


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(ROW, min_size=0, max_size=40), per=st.integers(1, 15), chunk=st.integers(1, 300),
       crlf=st.booleans(), missing=st.booleans())
def test_columnar_reader_matches_the_row_reader(rows, per, chunk, crlf, missing):
    """Same shards or the same first error (message, field, row), blank and ragged lines included."""
    nl = "\r\n" if crlf else "\n"
    lines = ["time,n,label"] + ["" if blank else f"{t},{n},{label}" for t, n, label, blank in rows]
    data = nl.join(lines).encode() + nl.encode()
    options = CsvOptions(missing=("", "n/a", "NaN") if missing else ())
    fast = _outcome(lambda: shard_csv(_chunks(data, chunk), source="t.csv", rows_per_shard=per, columns=COLUMNS,
                                      options=options))
    assert fast == _outcome(_reference(data, per, options))


def test_a_quote_later_in_the_file_hands_over_with_the_same_row_numbers():
    body = "".join(f"{i},{i},x\n" for i in range(5000)) + '1.0,7,"quoted, with a comma"\n' + "2.0,oops,y\n"
    data = ("time,n,label\n" + body).encode()
    with pytest.raises(InputRejected) as err:
        list(shard_csv(_chunks(data, 997), source="t.csv", rows_per_shard=100, columns=COLUMNS))
    assert err.value.row == 5003 and err.value.field == "n" and "'oops' is not int" in err.value.message
    good = data.replace(b"oops", b"8")
    shards = list(shard_csv(_chunks(good, 997), source="t.csv", rows_per_shard=100, columns=COLUMNS))
    rows = [r for s in shards for r in list(csv.reader(io.StringIO(s.data.decode())))[1:]]
    assert len(rows) == 5002 and rows[-2] == ["1.0", "7", "quoted, with a comma"]
    assert [s.first_row for s in shards][:3] == [2, 102, 202]


def test_wrong_field_count_in_a_big_block_names_its_row():
    data = ("time,n,label\n" + "".join(f"{i}.5,{i},x\n" for i in range(20000)) + "1.0,2\n").encode()
    with pytest.raises(InputRejected) as err:
        list(shard_csv([data], source="t.csv", rows_per_shard=1000, columns=COLUMNS))
    assert err.value.row == 20002 and err.value.field == "row" and "has 2 fields; the header has 3" in err.value.message


def test_comment_lines_delimiter_and_missing_values():
    data = (b"# instrument: buoy 7\n# units: s, m, m\ntime;heave;site\n"
            b"0.0;1.5;north\n0.5;n/a;south\n1.0;;n/a\n1.5;NaN;east\n")
    opts = CsvOptions(delimiter=";", comment="#", missing=("", "NaN", "n/a"))
    [shard] = shard_csv([data], source="t.csv", rows_per_shard=10, columns={"time": "float", "heave": "float",
                                                                            "site": "str"}, options=opts)
    assert shard.data.decode() == "time,heave,site\n0.0,1.5,north\n0.5,NaN,south\n1.0,NaN,n/a\n1.5,NaN,east\n"
    assert shard.first_row == 4  # the header is row 3 of the file
    with pytest.raises(InputRejected) as err:
        list(shard_csv([data.replace(b"1.5;NaN", b"1.5;bad")], source="t.csv", rows_per_shard=10,
                       columns={"heave": "float"}, options=opts))
    assert err.value.row == 7 and err.value.field == "heave"


def test_without_missing_option_an_empty_cell_is_still_refused():
    with pytest.raises(InputRejected) as err:
        list(shard_csv([b"time,a\n0.1,1\n0.2,\n"], source="t.csv", columns={"a": "float"}))
    assert err.value.row == 3 and err.value.field == "a" and "'' is not float" in err.value.message


def test_a_delimiter_with_commas_in_fields_goes_through_the_csv_module():
    data = b"time;label\n0.1;a, b\n0.2;c\n"
    [shard] = shard_csv([data], source="t.csv", options=CsvOptions(delimiter=";"))
    assert list(csv.reader(io.StringIO(shard.data.decode()))) == [["time", "label"], ["0.1", "a, b"], ["0.2", "c"]]


def test_quoted_header_and_comment_only_head_use_the_csv_module():
    data = b'# a\n# b\n"time","a"\n1,2\n'
    [shard] = shard_csv([data], source="t.csv", columns={"a": "int"}, options=CsvOptions(comment="#"))
    assert shard.data == b"time,a\n1,2\n" and shard.first_row == 4
