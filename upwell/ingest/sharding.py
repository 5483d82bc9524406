"""The streaming CSV sharder: split by rows or by size (a Parquet drop's shards are its row groups:
``upwell.ingest.parquetshards``).

Input arrives as an iterator of byte chunks and is never held whole in memory.
Each shard is a self-contained CSV with the header. Rows are checked against
the rule's column types; a bad row names its row number (1 = the header).
"""

from __future__ import annotations

import codecs
import csv
import io
import itertools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from upwell.documents import archive_kind
from upwell.errors import InputRejected
from upwell.ingest import csvblocks
from upwell.ingest.lineindex import CountedIndex
from upwell.ingest.rawblocks import Pieces
from upwell.ingest.shardwriter import Shard, Writer, raw_ends
from upwell.shardref import HEADER_LIMIT

MAX_LINE_BYTES = 1 << 20
# Only CR, LF and CRLF end a CSV line. str.splitlines() also splits at \v, \f, \x1c-\x1e, \x85,
# \u2028 and \u2029, which are ordinary characters inside a field.
_LINES = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")

@dataclass(frozen=True)
class CsvOptions:
    """How a rule's CSV is written: the delimiter, comment lines before the header, missing-value tokens.

    Cells equal to a ``missing`` token pass the type checks; in every column not declared ``str``
    they reach the shards as ``NaN``, which payloads read as a missing number."""

    delimiter: str = ","
    comment: str = ""
    missing: tuple[str, ...] = ()


BLOCK_BYTES = 4 << 20  # the columnar reader checks at least this much text at a time (a whole 16 MiB chunk)


def _decoded_lines(chunks: Iterable[bytes], source: str, max_line: int, *, first_line: int = 0,
                   check_head: bool = True, offset: int = 0) -> Iterator[str]:
    """Decode UTF-8 (with or without BOM) or UTF-16 (BOM) incrementally into lines."""
    it = iter(chunks)
    head = _head(it)
    if check_head:
        _refuse_archive(head, source)
    lines = _Lines(_decoder(head, check_head), source, max_line, first_line=first_line, check_nul=check_head,
                   offset=offset)
    yield from lines.feed(head)
    for chunk in it:
        yield from lines.feed(chunk)
    yield from lines.feed(b"", final=True)


def _head(it: Iterator[bytes], size: int = 512) -> bytes:
    """At least ``size`` bytes from the start of the stream (all of it when it is shorter)."""
    head = b""
    for chunk in it:
        head += chunk
        if len(head) >= size:
            break
    return head


def _refuse_archive(head: bytes, source: str) -> None:
    kind = archive_kind(head)
    if kind:
        raise InputRejected(f"{source} is a {kind} archive; archives are not accepted: upload the files "
                            "themselves", field="document", source=source)


def _decoder(head: bytes, check_head: bool) -> codecs.IncrementalDecoder:
    if check_head and head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return codecs.getincrementaldecoder("utf-16")(errors="strict")
    return codecs.getincrementaldecoder("utf-8-sig")(errors="strict")


class _Lines:
    """Bytes in, complete lines out. State: the decoder, an unfinished line held back, the byte offset
    reached (for error messages) and the number of the last line counted."""

    def __init__(self, decoder: codecs.IncrementalDecoder, source: str, max_line: int, *, first_line: int,
                 check_nul: bool, offset: int) -> None:
        self.decoder, self.source, self.max_line, self.check_nul = decoder, source, max_line, check_nul
        self.pending = ""
        self.start = self.offset = offset
        self.lineno = first_line

    def feed(self, data: bytes, final: bool = False) -> list[str]:
        text = self._decode(data, final)
        self.offset += len(data)
        lines = _LINES.findall(self.pending + text)
        self.pending = ""
        # Hold back an unfinished line, and a bare "\r" that may be half of a "\r\n".
        if lines and not final and (not lines[-1].endswith(("\n", "\r")) or lines[-1].endswith("\r")):
            self.pending = lines.pop()
        self._count(lines)
        return lines

    def _decode(self, data: bytes, final: bool) -> str:
        try:
            text = self.decoder.decode(data, final)
        except UnicodeDecodeError as exc:
            raise InputRejected(f"{self.source}: not valid UTF-8/UTF-16 near byte {self.offset + exc.start}",
                                field="encoding", source=self.source) from None
        if self.offset == self.start and self.check_nul and "\x00" in text:
            raise InputRejected(f"{self.source} contains NUL characters: a binary file, or UTF-16 text without a "
                                "byte-order mark (save it as UTF-8, or UTF-16 with BOM)", field="encoding",
                                source=self.source)
        return text

    def _count(self, lines: list[str]) -> None:
        """Number the lines, and refuse one longer than max_line (the held-back part counts too)."""
        for line in [*lines, self.pending]:
            if len(line) > self.max_line:
                raise InputRejected(f"{self.source}: line {self.lineno + 1} is longer than {self.max_line} "
                                    "characters", field="row", limit=f"max_line_bytes={self.max_line}",
                                    source=self.source)
            self.lineno += 1
        self.lineno -= 1  # pending is counted again when it is complete


_CASTS = {"float": float, "int": int, "str": str}


def _check_row(row: list[str], width: int, checks: list[tuple[int, str, str]], rowno: int, source: str,
               missing: frozenset[str] = frozenset()) -> None:
    if len(row) != width:
        raise InputRejected(f"{source}: row {rowno} has {len(row)} fields; the header has {width}",
                            field="row", row=rowno, source=source)
    for index, col, kind in checks:
        value = row[index]
        if value in missing:
            continue
        try:
            _CASTS[kind](value)
        except ValueError:
            raise InputRejected(f"{source}: row {rowno} column {col!r}: {value[:40]!r} is not {kind}",
                                field=col, row=rowno, source=source) from None


@dataclass
class _Table:
    """What the header said: the columns, the type checks, and where the header was."""

    header: list[str]
    checks: list[tuple[int, str, str]]
    numeric: list[int]
    row: int  # the header's row number (1 unless comment lines come first)


def _header(row: list[str], rowno: int, columns: dict[str, str], source: str) -> _Table:
    header = [h.strip() for h in row]
    if not any(header):
        raise InputRejected(f"{source}: the header row is empty", field="header", row=rowno, source=source)
    missing = [c for c in columns if c not in header]
    if missing:
        raise InputRejected(f"{source}: header lacks required columns {missing}; it has {header}",
                            field=missing[0], row=rowno, source=source)
    checks = [(header.index(c), c, k) for c, k in columns.items() if k != "str"]
    numeric = [i for i, h in enumerate(header) if columns.get(h) != "str"]
    return _Table(header, checks, numeric, rowno)


def shard_csv(chunks: Iterable[bytes], *, source: str, rows_per_shard: int | None = None,
              bytes_per_shard: int | None = None, columns: dict[str, str] | None = None,
              max_shards: int = 10_000, max_line: int = MAX_LINE_BYTES,
              options: CsvOptions | None = None, refs: bool = False) -> Iterator[Shard]:
    """Split a CSV stream into shards of at most ``rows_per_shard`` rows or ``bytes_per_shard`` bytes.

    UTF-8 text without quotes goes through the columnar reader (``csvblocks``) block by block; from
    the first block with a quote (and for UTF-16) rows go through Python's csv module. Both give the
    same shards and the same errors (field, row, limit). With ``refs``, a shard the columnar reader
    checked whole is a byte range of the input instead of a copy (``shardwriter``)."""
    if not rows_per_shard and not bytes_per_shard:
        rows_per_shard = 1000
    return _Sharder(source, rows_per_shard, bytes_per_shard, columns or {}, max_shards, max_line,
                    options or CsvOptions(), refs).run(iter(chunks))
class _Sharder:
    """One CSV stream: the columnar reader while the text allows it, Python's csv module after.

    State: the options, the header (once read), the shard writer and the last row number read."""

    def __init__(self, source: str, rows: int | None, size: int | None, columns: dict[str, str], max_shards: int,
                 max_line: int, options: CsvOptions, refs: bool = False):
        self.source, self.rows, self.size, self.columns, self.refs = source, rows, size, columns, refs
        self.max_shards, self.max_line, self.opt = max_shards, max_line, options
        self.delim = options.delimiter.encode()
        self.table: _Table | None = None
        self.writer: Writer | None = None

    def run(self, it: Iterator[bytes]) -> Iterator[Shard]:
        head = b""
        for chunk in it:
            head += chunk
            if len(head) >= 512:
                break
        kind = archive_kind(head)
        if kind:
            raise InputRejected(f"{self.source} is a {kind} archive; archives are not accepted: upload the files "
                                "themselves", field="document", source=self.source)
        if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) or len(self.delim) != 1 or self.delim == b'"':
            yield from self._slow(itertools.chain([head], it), rowno=0)
            return
        yield from self._fast(head, it)

    # -- the columnar reader ------------------------------------------------------------
    def _fast(self, head: bytes, it: Iterator[bytes]) -> Iterator[Shard]:
        bom = len(codecs.BOM_UTF8) if head.startswith(codecs.BOM_UTF8) else 0
        pieces, offset, rowno, eof, target = Pieces(head[bom:]), bom, 0, False, 512
        while True:
            while not eof and pieces.size < target:
                chunk = next(it, None)
                eof = chunk is None
                pieces.add(chunk or b"")
            raw = pieces.take_all() if eof else pieces.cut()
            if raw is None:  # no line end yet: read more
                self._no_line_end(pieces, rowno)
                target *= 2
                continue
            target = min(max(target * 2, 512), max(BLOCK_BYTES, 4 * self.max_line + 8))
            if not raw:
                break
            cr = b"\r" in raw
            block = self._text(raw, offset, first=self.table is None, cr=cr)
            quoting = b'"' in block or (self.delim != b"," and b"," in block)  # csv from here on
            base, first_line, whole = offset, rowno + 1, self.table is not None and not cr
            if self.table is None:
                block, rowno = (None, 0) if quoting else self._fast_header(block, raw, base)
                if block is None:
                    yield from self._slow(itertools.chain([head[:bom], raw, pieces.take_all()], it), rowno=0,
                                          offset=bom)
                    return
            elif quoting:
                yield from self._slow(itertools.chain([raw, pieces.take_all()], it), rowno=rowno, offset=offset)
                return
            offset += len(raw)
            if not block:
                continue
            lines = csvblocks.check_block(block, rowno + 1, self._layout(), self.max_line)
            data = lines.data if self.delim == b"," else lines.data.replace(self.delim, b",")
            ranged = self.writer.pos >= 0
            index = self._ranged(raw, base, lines, first_line, whole) if ranged else lines.index
            yield from self.writer.lines(data, index, ranged)
            rowno += lines.count
        if self.table is None:
            raise InputRejected(f"{self.source} is empty", field="document", row=0, source=self.source)
        yield from self.writer.finish(self.table.row)

    def _no_line_end(self, pieces: Pieces, rowno: int) -> None:
        """No line ends in what is held: refuse it once it is past the line limit."""
        if pieces.size > 4 * self.max_line + 4 or len(pieces.joined().decode("utf-8", "ignore")) > self.max_line:
            raise InputRejected(f"{self.source}: line {rowno + 1} is longer than {self.max_line} characters",
                                field="row", limit=f"max_line_bytes={self.max_line}", source=self.source)

    @staticmethod
    def _ranged(raw: bytes, base: int, lines: csvblocks.Lines, first_line: int, whole: bool):
        """``lines.index`` with where each checked line ends in the original. ``whole``: the block checked is
        ``raw`` itself, with no CR, or a final LF added at the end of the input; then the block's own line ends
        are the original's (the last one clipped to ``raw``) and no second scan of the bytes is needed."""
        index, limit = lines.index, base + len(raw)
        if isinstance(index, CountedIndex):
            if whole:
                return index.ranged(base, limit)
            index = index.arrays()
        if not whole:
            return index.ranged(raw_ends(raw, base)[index.rows - first_line])
        ends = lines.line_ends + base
        if len(ends) and ends[-1] > limit:
            ends[-1] = limit
        return index.ranged(ends if lines.count == index.n else ends[index.rows - first_line])

    def _text(self, raw: bytes, offset: int, first: bool, cr: bool) -> bytes:
        """``raw`` checked as UTF-8, with CR and CRLF line ends turned into LF and a last LF added. ``cr``:
        whether ``raw`` holds a CR. ASCII needs no decoding to be valid UTF-8."""
        if not raw.isascii():
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputRejected(f"{self.source}: not valid UTF-8/UTF-16 near byte {offset + exc.start}",
                                    field="encoding", source=self.source) from None
        if first and b"\x00" in raw:
            raise InputRejected(f"{self.source} contains NUL characters: a binary file, or UTF-16 text without a "
                                "byte-order mark (save it as UTF-8, or UTF-16 with BOM)", field="encoding",
                                source=self.source)
        block = raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n") if cr else raw
        return block if not block or block.endswith(b"\n") else block + b"\n"

    def _fast_header(self, block: bytes, raw: bytes, base: int) -> tuple[bytes | None, int]:
        """Skip comment lines, read the header; (the rest of the block, the header's row number). ``raw``: the
        block as read, from ``base`` of the input (the rows' ranges start where the header line ends)."""
        pos, rowno, comment = 0, 1, self.opt.comment.encode()
        while comment and block.startswith(comment, pos):
            pos, rowno = block.index(b"\n", pos) + 1, rowno + 1
        end = block.find(b"\n", pos)
        line = block[pos:end]
        if end < 0 or b'"' in line or len(line) + 1 > self.max_line:  # the csv module says what is wrong
            return None, 0
        self._start([] if not line else line.decode().split(self.opt.delimiter), rowno)
        if self.refs:
            self.writer.start_at(int(raw_ends(raw, base)[rowno - 1]))
        return block[end + 1:], rowno

    def _start(self, header: list[str], rowno: int) -> None:
        self.table = _header(header, rowno, self.columns, self.source)
        head = _RowText()(self.table.header)
        self.writer = Writer(head, self.rows, self.size, self.max_shards, self.source,
                             refs=self.refs and len(head) <= HEADER_LIMIT, numeric=tuple(self.table.numeric))

    def _layout(self) -> csvblocks.Layout:
        t = self.table
        return csvblocks.Layout(len(t.header), self.delim, tuple(t.checks), tuple(self.opt.missing), self.source,
                                tuple(t.numeric))

    # -- Python's csv module ----------------------------------------------------------------
    def _slow(self, chunks: Iterable[bytes], rowno: int, offset: int = 0) -> Iterator[Shard]:
        lines = _decoded_lines(chunks, self.source, self.max_line, first_line=rowno, check_head=rowno == 0,
                               offset=offset)
        if self.table is None:
            lines, rowno = self._skip_comments(lines)
        reader = csv.reader(lines, strict=True, delimiter=self.opt.delimiter)
        if self.table is None:
            try:
                header = next(reader)
            except StopIteration:
                raise InputRejected(f"{self.source} is empty", field="document", row=0, source=self.source) from None
            except csv.Error as exc:
                raise InputRejected(f"{self.source}: header: {exc}", field="header", row=rowno + 1,
                                    source=self.source) from None
            rowno += 1
            self._start(header, rowno)
        yield from self._slow_rows(reader, rowno)

    def _skip_comments(self, lines: Iterator[str]) -> tuple[Iterator[str], int]:
        if not self.opt.comment:
            return lines, 0
        skipped = 0
        for line in lines:
            if not line.startswith(self.opt.comment):
                return itertools.chain([line], lines), skipped
            skipped += 1
        return iter(()), skipped

    def _slow_rows(self, reader, rowno: int) -> Iterator[Shard]:
        t, text = self.table, _RowText()
        width, missing, numeric = len(t.header), frozenset(self.opt.missing), set(t.numeric)
        while True:
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as exc:
                raise InputRejected(f"{self.source}: row {rowno + 1}: {exc}", field="row", row=rowno + 1,
                                    source=self.source) from None
            rowno += 1
            if not row:
                continue  # blank line
            _check_row(row, width, t.checks, rowno, self.source, missing)
            if missing:
                row = ["NaN" if i in numeric and v in missing else v for i, v in enumerate(row)]
            yield from self.writer.row(text(row), rowno)
        yield from self.writer.finish(t.row)


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
