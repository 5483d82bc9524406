"""Streaming sharders: CSV split by rows or by size, Parquet by rows.

Input arrives as an iterator of byte chunks and is never held whole in memory.
Each shard is a self-contained CSV with the header. Rows are checked against
the rule's column types; a bad row names its row number (1 = the header).
"""

from __future__ import annotations

import codecs
import csv
import io
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from upwell.errors import InputRejected

MAX_LINE_BYTES = 1 << 20
# Only CR, LF and CRLF end a CSV line. str.splitlines() also splits at \v, \f, \x1c-\x1e, \x85,
# \u2028 and \u2029, which are ordinary characters inside a field.
_LINES = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")
ARCHIVE_MAGIC = ((b"PK\x03\x04", "zip"), (b"PK\x05\x06", "zip"), (b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"),
                 (b"\xfd7zXZ\x00", "xz"), (b"7z\xbc\xaf\x27\x1c", "7z"), (b"Rar!\x1a\x07", "rar"),
                 (b"\x28\xb5\x2f\xfd", "zstd"), (b"\x04\x22\x4d\x18", "lz4"))


def archive_kind(head: bytes) -> str:
    """The archive or compression format ``head`` (the first bytes of a file) starts with, or ''."""
    for magic, kind in ARCHIVE_MAGIC:
        if head.startswith(magic):
            return kind
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "tar"
    return ""


@dataclass(frozen=True)
class Shard:
    index: int
    data: bytes
    rows: int
    first_row: int  # row number of its first data row in the source (header = 1)


def _decoded_lines(chunks: Iterable[bytes], source: str, max_line: int) -> Iterator[str]:  # noqa: C901 - one pass over the bytes; split with the CSV options of issue 15
    """Decode UTF-8 (with or without BOM) or UTF-16 (BOM) incrementally into lines."""
    it = iter(chunks)
    head = b""
    for chunk in it:
        head += chunk
        if len(head) >= 512:
            break
    kind = archive_kind(head)
    if kind:
        raise InputRejected(f"{source} is a {kind} archive; archives are not accepted: upload the files "
                            "themselves", field="document", source=source)
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        decoder = codecs.getincrementaldecoder("utf-16")(errors="strict")
    else:
        decoder = codecs.getincrementaldecoder("utf-8-sig")(errors="strict")
    pending = ""
    offset = 0
    lineno = 0

    def feed(data: bytes, final: bool = False) -> Iterator[str]:
        nonlocal pending, offset, lineno
        try:
            text = decoder.decode(data, final)
        except UnicodeDecodeError as exc:
            raise InputRejected(f"{source}: not valid UTF-8/UTF-16 near byte {offset + exc.start}",
                                field="encoding", source=source) from None
        if offset == 0 and "\x00" in text:
            raise InputRejected(f"{source} contains NUL characters: a binary file, or UTF-16 text without a "
                                "byte-order mark (save it as UTF-8, or UTF-16 with BOM)", field="encoding",
                                source=source)
        offset += len(data)
        pending += text
        lines = _LINES.findall(pending)
        pending = ""
        # Hold back an unfinished line, and a bare "\r" that may be half of a "\r\n".
        if lines and not final and (not lines[-1].endswith(("\n", "\r")) or lines[-1].endswith("\r")):
            pending = lines.pop()
        for line in [*lines, pending]:
            if len(line) > max_line:
                raise InputRejected(f"{source}: line {lineno + 1} is longer than {max_line} characters",
                                    field="row", limit=f"max_line_bytes={max_line}", source=source)
            lineno += 1
        lineno -= 1  # pending is counted again when it is complete
        yield from lines

    yield from feed(head)
    for chunk in it:
        yield from feed(chunk)
    yield from feed(b"", final=True)


_CASTS = {"float": float, "int": int, "str": str}


def _check_row(row: list[str], width: int, checks: list[tuple[int, str, str]], rowno: int, source: str) -> None:
    if len(row) != width:
        raise InputRejected(f"{source}: row {rowno} has {len(row)} fields; the header has {width}",
                            field="row", row=rowno, source=source)
    for index, col, kind in checks:
        value = row[index]
        try:
            _CASTS[kind](value)
        except ValueError:
            raise InputRejected(f"{source}: row {rowno} column {col!r}: {value[:40]!r} is not {kind}",
                                field=col, row=rowno, source=source) from None


def shard_csv(  # noqa: C901 - one streaming pass; split with the CSV options of issue 15
        chunks: Iterable[bytes], *, source: str, rows_per_shard: int | None = None,
        bytes_per_shard: int | None = None, columns: dict[str, str] | None = None,
        max_shards: int = 10_000, max_line: int = MAX_LINE_BYTES) -> Iterator[Shard]:
    """Split a CSV stream into shards of at most ``rows_per_shard`` rows or ``bytes_per_shard`` bytes."""
    if not rows_per_shard and not bytes_per_shard:
        rows_per_shard = 1000
    columns = columns or {}
    lines = _decoded_lines(chunks, source, max_line)
    reader = csv.reader(lines, strict=True)
    try:
        header = next(reader)
    except StopIteration:
        raise InputRejected(f"{source} is empty", field="document", row=0, source=source) from None
    except csv.Error as exc:
        raise InputRejected(f"{source}: header: {exc}", field="header", row=1, source=source) from None
    header = [h.strip() for h in header]
    if not any(header):
        raise InputRejected(f"{source}: the header row is empty", field="header", row=1, source=source)
    missing = [c for c in columns if c not in header]
    if missing:
        raise InputRejected(f"{source}: header lacks required columns {missing}; it has {header}",
                            field=missing[0], row=1, source=source)
    checks = [(header.index(c), c, k) for c, k in columns.items() if k != "str"]
    width = len(header)
    line = _RowText()
    head = line(header)
    data, count, index, first = bytearray(head), 0, 0, 0
    rowno = 1
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            raise InputRejected(f"{source}: row {rowno + 1}: {exc}", field="row", row=rowno + 1,
                                source=source) from None
        rowno += 1
        if not row:
            continue  # blank line
        _check_row(row, width, checks, rowno, source)
        if count == 0:
            first = rowno
        data += line(row)
        count += 1
        if (rows_per_shard and count >= rows_per_shard) or (bytes_per_shard and len(data) >= bytes_per_shard):
            if index + 1 > max_shards:
                raise InputRejected(f"{source} makes more than {max_shards} shards", field="shard",
                                    limit=f"max_shards={max_shards}", source=source)
            yield Shard(index, bytes(data), count, first)
            index += 1
            data, count = bytearray(head), 0
    if count:
        if index + 1 > max_shards:
            raise InputRejected(f"{source} makes more than {max_shards} shards", field="shard",
                                limit=f"max_shards={max_shards}", source=source)
        yield Shard(index, bytes(data), count, first)
    elif index == 0:
        raise InputRejected(f"{source} has a header but no data rows", field="row", row=2, source=source)


class _RowText:
    """Formats one CSV row as UTF-8 bytes, so that shard sizes are counted in bytes, not characters.

    csv.writer with lineterminator "\n" leaves a field holding a lone "\r" unquoted, which a
    reader then splits; such rows are written with every field quoted."""

    def __init__(self) -> None:
        self.buf = io.StringIO()
        self.writer = csv.writer(self.buf, lineterminator="\n")
        self.quoted = csv.writer(self.buf, lineterminator="\n", quoting=csv.QUOTE_ALL)

    def __call__(self, row: list[str]) -> bytes:
        self.buf.seek(0)
        self.buf.truncate()
        (self.quoted if any("\r" in f for f in row) else self.writer).writerow(row)
        return self.buf.getvalue().encode()


def shard_parquet(path: str, *, source: str, rows_per_shard: int = 1000, columns: dict[str, str] | None = None,
                  max_shards: int = 10_000) -> Iterator[Shard]:
    """Split a Parquet file (already staged to a local path) into CSV shards, batch by batch."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputRejected(f"{source} is not a readable Parquet file: {exc}", field="document",
                            source=source) from None
    names = pf.schema_arrow.names
    missing = [c for c in (columns or {}) if c not in names]
    if missing:
        raise InputRejected(f"{source}: lacks required columns {missing}; it has {names}", field=missing[0],
                            source=source)
    first = 2
    for index, batch in enumerate(pf.iter_batches(batch_size=rows_per_shard)):
        if index + 1 > max_shards:
            raise InputRejected(f"{source} makes more than {max_shards} shards", field="shard",
                                limit=f"max_shards={max_shards}", source=source)
        out = io.BytesIO()
        pacsv.write_csv(pa.Table.from_batches([batch]), out)
        yield Shard(index, out.getvalue(), batch.num_rows, first)
        first += batch.num_rows
