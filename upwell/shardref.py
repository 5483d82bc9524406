"""A shard that references its data: a byte range of the original blob at a pinned version, not a copy.

Ingest checks a CSV drop once and records, for each row-block shard, where its rows lie in the original
(``offset``, ``length``) and which version it read (the ETag, and the version id where the account keeps
versions). A ``whole_files`` input is the range of the whole blob, with no header. The agent reads the range
with one conditional ranged GET (Get Blob with ``x-ms-range`` and ``If-Match``; the SDK's
``download_blob(offset, length, etag=..., match_condition=MatchConditions.IfNotModified)``, whose later chunk
requests carry the first response's ETag, azure-storage-blob ``_download.py``) and writes the header and then
the rows, normalised as ingest's shard copies were (``normalize``). A blob that changed answers 412
ConditionNotMet, one that is gone 404: both are ``ShardSourceChanged``, and the shard never runs on other
bytes (Blob service REST: "Specifying conditional headers for Blob service operations", "Get Blob").

A Parquet drop's shard is a set of consecutive row groups of the original at its pinned version
(``row_groups``: first and stop, ``rows`` its row count; ``length`` the blob's size): ingest read only the
footer, and the agent reads only the footer and those row groups, each read a conditional ranged GET
(``upwell.blobfile``), and writes the CSV file ingest's copy held (``row_groups_csv``).

The reference travels in the work item (``WorkItem.input_range``) and on the shard row (``input_range``, JSON),
so a re-run sends the same range."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from upwell.errors import DecodeError

# The header rides in every work item and shard row (a table string holds 32K characters): a CSV with a
# longer header is shard by copies, as before.
HEADER_LIMIT = 16 * 1024
_BLANKS = re.compile(rb"\n\n+")


@dataclass(frozen=True)
class ShardRef:
    """Where a shard's rows are: ``length`` bytes at ``offset`` of the input blob as of ``etag`` (and
    ``version_id``, when set). ``header``: the shard's first line (normalised CSV text, "" for a whole file);
    ``delimiter``, ``missing`` and ``numeric``: how the rows are normalised (see ``normalize``)."""

    offset: int
    length: int
    etag: str
    version_id: str = ""
    header: str = ""
    delimiter: str = ","
    missing: tuple[str, ...] = ()
    numeric: tuple[int, ...] = ()
    row_groups: tuple[int, ...] = ()  # a Parquet shard: (first, stop), the row groups first..stop-1
    rows: int = 0  # a Parquet shard's rows

    @property
    def whole(self) -> bool:
        """A whole file passed through as it is (no header, no normalising)."""
        return not self.header and not self.row_groups

    @property
    def groups(self) -> range:
        """A Parquet shard's row group indexes (empty for a byte range)."""
        return range(*self.row_groups) if self.row_groups else range(0)

    @property
    def span(self) -> str:
        """What of the pinned version the shard reads, for messages: its bytes or its row groups."""
        if self.row_groups:
            return f"row groups {self.row_groups[0]}-{self.row_groups[1] - 1} ({self.rows} rows)"
        return f"bytes {self.offset}-{self.offset + self.length}"

    def to_dict(self) -> dict[str, Any]:
        """The JSON form; a byte range's has no ``row_groups``/``rows`` (the form it had before they came)."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()
                if v or k not in ("row_groups", "rows")}

    @classmethod
    def from_dict(cls, data: Any) -> ShardRef:
        """The reference in a work item or a shard row; DecodeError naming what is wrong."""
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except ValueError as exc:
                raise DecodeError(f"input_range is not JSON: {exc}") from None
        if not isinstance(data, dict) or not {"offset", "length", "etag"} <= data.keys():
            raise DecodeError("input_range needs offset, length and etag")
        try:
            ref = cls(**{**data, "missing": tuple(data.get("missing", ())),
                         "numeric": tuple(int(i) for i in data.get("numeric", ())),
                         "row_groups": tuple(int(i) for i in data.get("row_groups", ()))})
        except (TypeError, ValueError) as exc:
            raise DecodeError(f"input_range: {exc}") from None
        if not (isinstance(ref.offset, int) and isinstance(ref.length, int)) or ref.offset < 0 or ref.length < 0 \
                or not ref.etag:
            raise DecodeError(f"input_range has a bad range or no ETag: {data}")
        if ref.row_groups and (len(ref.row_groups) != 2 or not 0 <= ref.row_groups[0] < ref.row_groups[1]
                               or not isinstance(ref.rows, int) or ref.rows < 0):
            raise DecodeError(f"input_range has bad row groups (first, stop) or rows: {data}")
        return ref


def normalize(chunks: Iterable[bytes], ref: ShardRef) -> Iterator[bytes]:
    """The shard file: the header, then the range's lines with CR and CRLF ends turned into LF, blank lines
    left out, each cell of a ``numeric`` column that is a ``missing`` token written ``NaN``, the delimiter
    written ``,``, and a last LF added: the bytes ingest's row-block copy held. A whole file passes as it is.

    The range starts at a line start and ends at a line end (ingest cut it there), so it is cut here only
    at line ends; a CR at a chunk's end waits for the next chunk (it may be half a CRLF)."""
    if ref.whole:
        yield from chunks
        return
    yield ref.header.encode()
    carry = b""
    for chunk in chunks:
        buf = carry + chunk
        cut = max(buf.rfind(b"\n"), buf.rfind(b"\r", 0, len(buf) - 1)) + 1
        carry = buf[cut:]
        if cut:
            yield _lines(buf[:cut], ref)
    if carry:
        yield _lines(carry + b"\n", ref)


def row_groups_csv(source: Any, ref: ShardRef, out: Any) -> int:
    """The shard file of a Parquet reference, written into ``out``; its row count. ``source``: the original as a
    seekable file of the pinned version (``upwell.blobfile.BlobFile``), of which only the footer and the
    reference's row groups are read. The CSV is what ingest's copy of the same rows held (pyarrow's
    ``write_csv``: the header with every name quoted, then the rows), streamed in record batches, so a large
    row group is never held whole. DecodeError when the file has not the row groups or rows the reference
    names (a reference that does not belong to this version)."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(source, pre_buffer=True)
    meta = pf.metadata
    if ref.row_groups[1] > meta.num_row_groups or sum(meta.row_group(i).num_rows for i in ref.groups) != ref.rows:
        raise DecodeError(f"input_range names {ref.span}; the file has {meta.num_row_groups} row groups and "
                          "other rows there")
    with pacsv.CSVWriter(out, pf.schema_arrow) as writer:
        for batch in pf.iter_batches(batch_size=64 * 1024, row_groups=list(ref.groups)):
            writer.write_batch(batch)
    return ref.rows


def _lines(text: bytes, ref: ShardRef) -> bytes:
    """Whole lines of the range, normalised (see ``normalize``)."""
    if b"\r" in text:
        text = text.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    text = _BLANKS.sub(b"\n", text).lstrip(b"\n")
    delim = ref.delimiter.encode()
    if not ref.missing:
        return text if delim == b"," else text.replace(delim, b",")
    tokens, numeric = {t.encode() for t in ref.missing}, set(ref.numeric)
    out = []
    for line in text.split(b"\n")[:-1]:
        cells = line.split(delim)
        out.append(b",".join(b"NaN" if i in numeric and c in tokens else c for i, c in enumerate(cells)))
    return b"\n".join(out) + b"\n" if out else b""
