"""Columnar checks of one block of CSV lines: field counts with numpy, types with pyarrow.

A block holds whole lines of UTF-8 text with no quote character, each ending in "\\n"
(CR and CRLF already turned into LF), so every delimiter separates fields and every
LF ends a record, as Python's csv module would read them. ``check_block`` finds the
first bad record in the same order as the row-by-row reader: the earliest row first,
and in a row the field count before the columns in the rule's order. A value the
vectorised pattern does not accept is re-checked with Python's ``float``/``int``, so
the set of accepted values is exactly the row-by-row reader's.
"""

from __future__ import annotations

import io
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from upwell.errors import InputRejected
from upwell.ingest.lineindex import ArrayIndex, CountedIndex

# Subsets of what float() and int() accept; anything else is asked of Python itself.
_PATTERNS = {"float": r"^[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|(?i:inf|infinity|nan))$",
             "int": r"^[+-]?[0-9]+$"}
_CASTS = {"float": float, "int": int, "str": str}
FIELD_LIMIT = 131072  # csv.field_size_limit(): the row-by-row reader refuses longer fields
# Arrow's block size. A checked block is one download chunk (16 MiB, upwell.storage.CHUNK_GET_BYTES): two Arrow
# blocks, which Arrow's own threads parse side by side (use_threads) on the checker's call, beside the download and
# the reader's own thread. Over 1 MiB blocks (Arrow's default) its threads cost 6% more CPU a GB (3.00 against 2.83
# CPU s) and made a 1 GB ingest slower when a download served in 4 MiB ranges kept Azurite busy on the same two
# cores (5.77-6.01 s against 5.28-5.85 s, 2026-12-04). With 16 MiB ranges Azurite needs a third of that CPU, and
# two 8 MiB blocks at once took a 1 GB ingest from 3.28-3.70 s to 2.74-3.44 s (six runs each, bench/README.md,
# 2026-12-05). A row must fit in one block.
_ARROW_BLOCK = 8 << 20


@dataclass(frozen=True)
class Layout:
    """What a block is checked against: the header width, the typed columns and the missing-value tokens."""

    width: int
    delimiter: bytes
    checks: tuple[tuple[int, str, str], ...]  # (index, column, kind), kind float or int
    missing: tuple[str, ...]
    source: str
    numeric: tuple[int, ...] = ()  # columns whose missing cells shards carry as NaN (all but str ones)


@dataclass(frozen=True)
class Lines:
    """A checked block: ``data`` holds its non-blank lines; ``index`` where they end in ``data`` and their row
    numbers (``lineindex``); ``line_ends`` where every line of the block as given ends (blank ones included),
    past its LF: None for a plain block, whose lines are all kept as they are (its index says where they end)."""

    data: bytes
    index: ArrayIndex | CountedIndex
    count: int  # lines in the block, blank ones included (rows advance by this much)
    line_ends: np.ndarray | None


def check_block(block: bytes, first_row: int, layout: Layout, max_line: int) -> Lines:
    """Validate ``block`` (see the module docstring); its first line is row ``first_row``.

    Arrow's typed parse of the block runs in a thread (it leaves the GIL) while numpy finds the line ends
    here, so the two overlap; a block with a line too long for Arrow's default block size is parsed again
    with a block size that fits it. A block the typed parse takes whole, with no blank line and no line near
    the limits, is plain: its lines are counted, not listed (``_plain``)."""
    typed = _checker().submit(_typed_ok, block, layout, 0) if _typed_candidate(block, layout) else None
    arr = np.frombuffer(block, dtype=np.uint8)
    if typed is not None:
        plain = _plain(block, arr, first_row, typed, min(max_line, FIELD_LIMIT))
        if plain is not None:
            return plain
    nl = np.flatnonzero(arr == 10)
    starts = np.empty_like(nl)
    starts[:1] = 0
    starts[1:] = nl[:-1] + 1
    lens = nl - starts
    _line_limits(block, starts, lens, first_row, layout, max_line)
    blank = lens == 0
    longest = int(lens.max(initial=0))
    keep = np.flatnonzero(~blank)
    table, bad = None, None
    if len(keep) and _typed_result(typed, block, layout, longest):
        pass  # every row has the header's width and every typed value is one Python accepts
    elif len(keep):
        try:  # Arrow refuses a row with another field count; only then are the rows counted here
            table = _read(block, layout, longest)
        except _arrow_invalid():
            bad, fields = _field_counts(arr, nl, starts, blank, layout)
            keep = keep[keep < bad]
            table = _read(block[: int(starts[bad])], layout, longest) if len(keep) else None
    type_error = _first_type_error(table, keep, first_row, layout, block) if table is not None else None
    if type_error is not None:
        raise type_error
    if bad is not None:
        raise InputRejected(f"{layout.source}: row {first_row + bad} has {int(fields[bad])} fields; the header "
                            f"has {layout.width}", field="row", row=first_row + bad, source=layout.source)
    fix = _missing_rows(table, layout) if table is not None and layout.missing else None
    line_ends = nl + 1
    if fix is not None and len(fix):
        return _rewrite(block, nl, blank, first_row, layout, set(keep[fix].tolist()), line_ends)
    if blank.any():
        nonblank = ~blank
        data = b"".join(block[s:e + 1] for s, e in _runs(starts, nl, nonblank))
        ends = np.cumsum(lens[nonblank] + 1)
        rows = first_row + np.flatnonzero(nonblank)
    else:
        data, ends, rows = block, line_ends, first_row + np.arange(len(nl))
    return Lines(data, ArrayIndex(ends, rows), len(nl), line_ends)


def _plain(block: bytes, arr: np.ndarray, first_row: int, typed: Future, limit: int) -> Lines | None:
    """``block`` as a plain block (see ``lineindex.CountedIndex``), or None where it may not be one.

    Plain: the typed parse took it and read as many rows as the block has LFs (Arrow skips empty lines, so
    fewer rows means a blank line), and no line reaches ``limit`` bytes, the line and field limits' smaller
    (``_line_limits`` then has nothing to look at). A line of ``limit`` bytes or more covers a whole aligned
    window of ``limit // 2`` bytes, so a block where every such window holds an LF has none; finding the first
    LF of each window reads a few bytes of it. Below 4 KiB windows the search costs more than it saves."""
    step = limit // 2
    if step < 4096 or any(block.find(b"\n", a, a + step) < 0 for a in range(0, len(block) - step + 1, step)):
        return None
    index = CountedIndex(arr, first_row)
    if typed.result() != index.n:
        return None
    return Lines(block, index, index.n, None)


_CHECKER: ThreadPoolExecutor | None = None


def _checker() -> ThreadPoolExecutor:
    """The threads that run Arrow's typed parse beside their callers (made on first use); one per ingest
    the host runs at once, up to four. Each waits on its parse, whose Arrow blocks run on Arrow's CPU pool (one
    thread a core)."""
    global _CHECKER
    if _CHECKER is None:
        _CHECKER = ThreadPoolExecutor(max_workers=4, thread_name_prefix="csv-typed")
    return _CHECKER


def _typed_result(typed: Future | None, block: bytes, layout: Layout, longest: int) -> bool:
    """The typed parse's answer: True when it took the block. A refusal may only mean that a line is longer
    than the block size it ran with (Arrow cannot split a row across its blocks): then it runs again with
    room for the longest line."""
    if typed is None:
        return False
    if typed.result() >= 0:
        return True
    return 2 * longest + 2 > _ARROW_BLOCK and _typed_ok(block, layout, longest) >= 0


def _arrow_invalid():
    import pyarrow as pa

    return pa.ArrowInvalid


def _field_counts(arr: np.ndarray, nl: np.ndarray, starts: np.ndarray, blank: np.ndarray,
                  layout: Layout) -> tuple[int, np.ndarray]:
    """The first non-blank line whose field count is not the header's, and every line's field count."""
    d = layout.delimiter[0]
    seen = np.cumsum(arr == d, dtype=np.int32)  # delimiters up to and including each byte
    fields = seen[nl] - seen[starts] + (arr[starts] == d) + 1
    bad = np.flatnonzero(~blank & (fields != layout.width))
    if not len(bad):
        raise AssertionError(f"{layout.source}: Arrow refused a block whose field counts are all right")
    return int(bad[0]), fields


def _runs(starts: np.ndarray, ends: np.ndarray, keep: np.ndarray):
    """(start, end) byte spans of consecutive kept lines."""
    idx = np.flatnonzero(keep)
    if not len(idx):
        return
    breaks = np.flatnonzero(np.diff(idx) != 1)
    first = np.r_[idx[0], idx[breaks + 1]]
    last = np.r_[idx[breaks], idx[-1]]
    for a, b in zip(first, last, strict=True):
        yield int(starts[a]), int(ends[b])


def _line_limits(block: bytes, starts, lens, first_row: int, layout: Layout, max_line: int) -> None:
    """The line-length limit (in characters, terminator included) and csv's field size limit."""
    for k in np.flatnonzero(lens + 1 > min(max_line, FIELD_LIMIT)):
        line = block[int(starts[k]): int(starts[k] + lens[k])].decode("utf-8")
        if len(line) + 1 > max_line:
            raise InputRejected(f"{layout.source}: line {first_row + k} is longer than {max_line} characters",
                                field="row", limit=f"max_line_bytes={max_line}", source=layout.source)
        if any(len(f) > FIELD_LIMIT for f in line.split(layout.delimiter.decode())):
            raise InputRejected(f"{layout.source}: row {first_row + k}: field larger than field limit "
                                f"({FIELD_LIMIT})", field="row", row=first_row + k, source=layout.source)


def _typed_candidate(block: bytes, layout: Layout) -> bool:
    """Whether the typed parse can take ``block`` at all (see ``_typed_ok``)."""
    if layout.missing or not layout.checks:
        return False
    kinds = {kind for _, _, kind in layout.checks}
    return not (("float" in kinds and b"(" in block) or ("int" in kinds and (b"x" in block or b"X" in block)))


def _typed_ok(block: bytes, layout: Layout, longest: int) -> int:
    """The rows Arrow reads in ``block`` (blank lines skipped) with the typed columns parsed straight to
    float64/int64: a count means every row has the header's width and every typed value parses, so the block is
    good as it stands. -1 (some row or value is refused, or the block needs the exact path) leaves the answer,
    and the named error, to the string-and-cast path below. Arrow's parser takes "nan(...)" as a float and
    "0x1F" as an int, which Python refuses: a block holding "(" (float checks) or "x" (int checks) never takes
    this path; missing-value tokens (strings in a numeric column) neither."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    if not _typed_candidate(block, layout):
        return -1
    names = [f"c{i}" for i in range(layout.width)]
    types = {f"c{i}": pa.float64() if kind == "float" else pa.int64() for i, _, kind in layout.checks}
    try:
        table = pacsv.read_csv(
            io.BytesIO(block),
            read_options=pacsv.ReadOptions(column_names=names, block_size=max(_ARROW_BLOCK, 2 * longest + 2),
                                           use_threads=True),
            parse_options=_parse_options(layout),
            convert_options=pacsv.ConvertOptions(column_types=types, include_columns=list(types), null_values=[],
                                                 strings_can_be_null=False, quoted_strings_can_be_null=False))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return -1
    return table.num_rows


def _parse_options(layout: Layout):
    import pyarrow.csv as pacsv

    return pacsv.ParseOptions(delimiter=layout.delimiter.decode(), quote_char=False, double_quote=False,
                              escape_char=False, newlines_in_values=False, ignore_empty_lines=True)


def _read(block: bytes, layout: Layout, longest: int):
    """The typed columns (and, with missing values, every non-str column) of ``block`` as strings."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    names = [f"c{i}" for i in range(layout.width)]
    cols = sorted({i for i, _, _ in layout.checks} | (set(layout.numeric) if layout.missing else set())) or [0]
    wanted = [names[i] for i in cols]
    return pacsv.read_csv(
        io.BytesIO(block),
        read_options=pacsv.ReadOptions(column_names=names, block_size=max(_ARROW_BLOCK, 2 * longest + 2)),
        parse_options=_parse_options(layout),
        convert_options=pacsv.ConvertOptions(column_types={n: pa.string() for n in wanted}, include_columns=wanted,
                                             strings_can_be_null=False, quoted_strings_can_be_null=False))


def _first_type_error(table, keep: np.ndarray, first_row: int, layout: Layout,
                      block: bytes) -> InputRejected | None:
    """The earliest bad typed value in ``table`` (rows before any bad field count), or None."""
    import pyarrow as pa
    import pyarrow.compute as pc

    found: tuple[int, int, str, str, str] | None = None  # (row index, check order, column, kind, value)
    for order, (index, col, kind) in enumerate(layout.checks):
        values = table.column(f"c{index}")
        if _all_cast(values, kind, block):
            continue
        ok = pc.match_substring_regex(values, _PATTERNS[kind])
        if layout.missing:
            ok = pc.or_(ok, pc.is_in(values, value_set=pa.array(layout.missing, pa.string())))
        if pc.all(ok).as_py():
            continue
        for i in np.flatnonzero(~ok.to_numpy(zero_copy_only=False)):
            if found is not None and (i, order) > found[:2]:
                break
            value = values[int(i)].as_py()
            try:
                _CASTS[kind](value)
            except ValueError:
                found = (int(i), order, col, kind, value)
                break
    if found is None:
        return None
    i, _, col, kind, value = found
    row = first_row + int(keep[i])
    return InputRejected(f"{layout.source}: row {row} column {col!r}: {value[:40]!r} is not {kind}",
                         field=col, row=row, source=layout.source)


def _all_cast(values, kind: str, block: bytes) -> bool:
    """Whether Arrow parses every value, and every one of them is a value Python's float()/int() accepts too.

    Arrow's parser also takes "nan(...)" as a float and "0x1F" as an int, which Python refuses; a column
    holding either goes the exact way (pattern, then Python)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if (b"(" in block) if kind == "float" else (b"x" in block or b"X" in block):
        return False
    try:
        pc.cast(values, pa.float64() if kind == "float" else pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False
    return True


def _missing_rows(table, layout: Layout) -> np.ndarray:
    """Indices (among non-blank lines) of rows holding a missing-value token other than NaN in a non-str column."""
    import pyarrow as pa
    import pyarrow.compute as pc

    tokens = pa.array([t for t in layout.missing if t != "NaN"], pa.string())
    if not len(tokens):
        return np.empty(0, dtype=np.int64)
    hit = None
    for index in layout.numeric:
        m = pc.is_in(table.column(f"c{index}"), value_set=tokens)
        hit = m if hit is None else pc.or_(hit, m)
    return np.flatnonzero(hit.to_numpy(zero_copy_only=False)) if hit is not None else np.empty(0, dtype=np.int64)


def _rewrite(block: bytes, nl: np.ndarray, blank: np.ndarray, first_row: int, layout: Layout,
             fix: set[int], line_ends: np.ndarray) -> Lines:
    """The block's non-blank lines, with missing cells of non-str columns written as NaN in lines ``fix``."""
    missing, numeric, delim = set(layout.missing), set(layout.numeric), layout.delimiter
    out, ends, rows, size, start = [], [], [], 0, 0
    for k, end in enumerate(nl.tolist()):
        line = block[start:end + 1]
        start = end + 1
        if blank[k]:
            continue
        if k in fix:
            cells = line[:-1].split(delim)
            line = delim.join(b"NaN" if i in numeric and c.decode() in missing else c
                              for i, c in enumerate(cells)) + b"\n"
        out.append(line)
        size += len(line)
        ends.append(size)
        rows.append(first_row + k)
    return Lines(b"".join(out), ArrayIndex(np.array(ends, dtype=np.int64), np.array(rows, dtype=np.int64)), len(nl),
                 line_ends)
