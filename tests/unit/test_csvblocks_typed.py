"""The typed fast path of the columnar reader: Arrow's float64/int64 parse accepts a block only when Python's
float()/int() accept every value in it, and a clean block takes it (the string read and casts are skipped)."""

from __future__ import annotations

import pytest

from upwell.errors import InputRejected
from upwell.ingest import csvblocks

EDGE = [
    "",
    " ",
    "NA",
    "NaN",
    "nan",
    "null",
    "N/A",
    "-nan",
    "nan(1)",
    "nan()",
    " 1.5",
    "1.5 ",
    "\t2",
    "1_000",
    "0x10",
    "0X1F",
    "1e5",
    "1E+05",
    ".5",
    "5.",
    "+.5e-3",
    "inf",
    "-Infinity",
    "INF",
    "1e400",
    "99999999999999999999",
    "\u0661\u0662",
    "1.5.5",
    "e5",
    "1e",
    "+",
    "-",
    "-0",
    "00012",
    "1d5",
    "1f",
    "0b1",
    "true",
    "1.0",
    "--1",
    "1 2",
    "\u00a01",
    "nanx",
    "infx",
]


def _layout(kind: str) -> csvblocks.Layout:
    return csvblocks.Layout(2, b",", ((1, "v", kind),), (), "src", (0, 1))


@pytest.mark.parametrize("kind", ["float", "int"])
@pytest.mark.parametrize("value", EDGE)
def test_typed_path_accepts_only_what_python_accepts(kind, value):
    block = f"a,1\nb,{value}\n".encode()
    try:
        (float if kind == "float" else int)(value)
        python = True
    except ValueError:
        python = False
    fast = csvblocks._typed_ok(block, _layout(kind), len(block)) >= 0
    assert not (fast and not python), f"Arrow's typed parse took {value!r} as {kind}; Python refuses it"
    if python:
        lines = csvblocks.check_block(block, 2, _layout(kind), 1 << 20)
        assert lines.data == block and [lines.index.row(k) for k in range(lines.index.n)] == [2, 3]
    else:
        with pytest.raises(InputRejected) as err:
            csvblocks.check_block(block, 2, _layout(kind), 1 << 20)
        assert (err.value.field, err.value.row) == ("v", 3)


def test_clean_block_takes_the_typed_path():
    block = b"".join(f"{i * 0.5},{i % 7 - 3}\n".encode() for i in range(1000))
    layout = csvblocks.Layout(2, b",", ((0, "t", "float"), (1, "n", "int")), (), "src", (0, 1))
    assert csvblocks._typed_ok(block, layout, 20) == 1000  # the rows it read
    assert csvblocks._typed_ok(block.replace(b"3\n", b"3,4\n", 1), layout, 20) == -1  # a row too wide
    with_missing = csvblocks.Layout(2, b",", layout.checks, ("NA",), "src", (0, 1))
    assert csvblocks._typed_ok(block, with_missing, 20) == -1  # missing tokens need the string path
