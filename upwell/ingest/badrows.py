"""Every bad row of a rejected CSV, up to a limit, for its ``.error.json`` (not only the first).

The sharders stop at the first bad row: nothing is dispatched from a file that is rejected, and the
columnar reader (``csvblocks``) finds that row fast. Only once a file is rejected does ``collect`` read it
again, row by row with Python's csv module and the sharder's own checks (``sharding._check_row``: the
field count, the declared types, the ``missing`` tokens), and note each bad row, its column and why, up to
``UPWELL_QUARANTINE_MAX_ROWS``. Rows are numbered as the sharder numbers them: comment lines before the
header count, the header is its own row. A problem that is not a row's (the encoding, a line over the
length limit, the header) ends the scan: what was found until then is kept.
"""

from __future__ import annotations

import csv
import itertools
from collections.abc import Iterable

from upwell.errors import InputRejected
from upwell.ingest import sharding


def collect(chunks: Iterable[bytes], *, source: str, columns: dict[str, str], options: sharding.CsvOptions,
            limit: int, max_line: int = sharding.MAX_LINE_BYTES) -> tuple[list[dict], bool]:
    """(the bad rows, each {"row", "field", "message"}, at most ``limit``; True when the scan stopped at the
    limit before the file's end: there may be more)."""
    found: list[dict] = []
    try:
        lines = sharding._decoded_lines(chunks, source, max_line)
        lines, rowno = _skip_comments(lines, options.comment)
        reader = csv.reader(lines, strict=True, delimiter=options.delimiter)
        header = next(reader, None)
        if header is None:
            return found, False
        rowno += 1
        table = sharding._header(header, rowno, columns, source)
        missing = frozenset(options.missing)
        while len(found) < limit:
            try:
                row = next(reader)
            except StopIteration:
                return found, False
            except csv.Error as exc:
                rowno += 1
                found.append({"row": rowno, "field": "row", "message": f"{source}: row {rowno}: {exc}"})
                continue
            rowno += 1
            problem = _problem(row, table, rowno, source, missing) if row else None
            if problem is not None:
                found.append({"row": problem.row, "field": problem.field, "message": problem.message})
        return found, True
    except (InputRejected, csv.Error):
        return found, False


def _problem(row: list[str], table, rowno: int, source: str, missing: frozenset[str]) -> InputRejected | None:
    try:
        sharding._check_row(row, len(table.header), table.checks, rowno, source, missing)
    except InputRejected as exc:
        return exc
    return None


def _skip_comments(lines, comment: str):
    if not comment:
        return lines, 0
    skipped = 0
    for line in lines:
        if not line.startswith(comment):
            return itertools.chain([line], lines), skipped
        skipped += 1
    return iter(()), skipped
