"""A Parquet drop into shards that reference it: sets of consecutive row groups of the original blob at the
version ingest read, never a copy.

Ingest reads only the footer, through a file of the pinned version whose every read is a conditional ranged
GET (``upwell.blobfile``), checks the schema against the declared columns, and cuts the row groups into
shards of about ``rows_per_shard`` rows. Each shard is an ``upwell.shardref.ShardRef`` (the blob's ETag and
version id, its size, the row groups, the row count) that travels in the work item and the shard row like a
CSV byte range; the agent reads only those row groups and writes the CSV ingest's copies used to hold
(``upwell.shardref.row_groups_csv``). Nothing is written under shards/.

Reading the footer follows Apache Parquet's file layout (the footer's FileMetaData holds the schema and, per
row group, its row count and column chunk offsets) and ``pyarrow.parquet.ParquetFile`` over a file-like
object (``metadata``, ``schema_arrow``, ``iter_batches(row_groups=...)``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from upwell import logs
from upwell.blobfile import BlobFile
from upwell.errors import InputRejected
from upwell.shardref import ShardRef

log = logs.get("upwell.ingest.parquetshards")

@dataclass(frozen=True)
class ParquetShard:
    """One shard of a Parquet drop: its number and its reference (row groups of the pinned original)."""

    index: int
    ref: ShardRef


def parquet_shards(blob: BlobFile, *, source: str, rows_per_shard: int | None = 1000,
                   bytes_per_shard: int | None = None, columns: dict[str, str] | None = None,
                   max_shards: int = 10_000) -> Iterator[ParquetShard]:
    """The shards of the Parquet file ``blob`` (at its pinned version): consecutive row groups, as many as fit
    in ``rows_per_shard`` rows and ``bytes_per_shard`` stored (compressed) bytes, whichever is given (``cuts``).
    A row group is never split, so a row group larger than a limit is one shard on its own, and row groups of
    no rows ride with their neighbours (a file of no rows makes no shard). Only the footer is read.
    InputRejected: not a Parquet file (field ``document``), a declared column missing or of another type (the
    column), more than ``max_shards`` shards (``shard``)."""
    meta = _footer(blob, source)
    check_schema(meta.schema.to_arrow_schema(), columns or {}, source)
    shards = cuts(meta, rows_per_shard, bytes_per_shard, source=source, max_shards=max_shards)
    log.info("ingest.parquet_footer", source=source, size=blob.size, row_groups=meta.num_row_groups,
             shards=len(shards), gets=blob.gets, read_bytes=blob.read_bytes)
    for index, (first, stop, rows) in enumerate(shards):
        yield ParquetShard(index, ShardRef(0, blob.size, blob.etag, blob.version_id, row_groups=(first, stop),
                                           rows=rows))


def local_shards(path, *, source: str, rows_per_shard: int | None = 1000, bytes_per_shard: int | None = None,
                 max_shards: int = 10_000) -> int:
    """How many shards ingest will cut from the local Parquet file at ``path`` (what ``upwell submit`` says
    before it uploads): the same ``cuts`` of its footer. InputRejected as ``parquet_shards``."""
    return len(cuts(_footer(path, source), rows_per_shard, bytes_per_shard, source=source, max_shards=max_shards))


def _footer(file, source: str):
    """The FileMetaData of ``file`` (a path or a file object); InputRejected where it is not Parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(file).metadata
        meta.schema.to_arrow_schema()
        return meta
    except (pa.ArrowException, OSError) as exc:
        raise InputRejected(f"{source} is not a readable Parquet file: {exc}", field="document",
                            source=source) from None


def cuts(meta, rows_per_shard: int | None, bytes_per_shard: int | None, *, source: str,
         max_shards: int) -> list[tuple[int, int, int]]:
    """(first, stop, rows) of each shard of the file whose footer is ``meta``: ``group_rows`` over its row
    groups' row counts and stored sizes (the sum of their column chunks' compressed sizes, what the agent
    reads). Neither limit given: 1,000 rows."""
    groups = [meta.row_group(i) for i in range(meta.num_row_groups)]
    sizes = [sum(g.column(j).total_compressed_size for j in range(g.num_columns)) for g in groups]
    if rows_per_shard is None and bytes_per_shard is None:
        rows_per_shard = 1000
    shards = list(group_rows([g.num_rows for g in groups], rows_per_shard, sizes, bytes_per_shard))
    if len(shards) > max_shards:
        raise InputRejected(f"{source} makes more than {max_shards} shards", field="shard",
                            limit=f"max_shards={max_shards}", source=source)
    return shards


def group_rows(counts: list[int], rows_per_shard: int | None, sizes: list[int] | None = None,
               bytes_per_shard: int | None = None) -> Iterator[tuple[int, int, int]]:
    """(first, stop, rows) for each run of consecutive row groups (``counts``: their row counts, ``sizes``:
    their bytes) that holds at most ``rows_per_shard`` rows and ``bytes_per_shard`` bytes (a limit of None: no
    limit), or one row group that alone holds more. Pure."""
    sizes = sizes or [0] * len(counts)
    first = rows = size = 0
    for i, (n, b) in enumerate(zip(counts, sizes, strict=True)):
        over = (rows_per_shard is not None and rows + n > rows_per_shard) or \
            (bytes_per_shard is not None and size + b > bytes_per_shard)
        if rows and over:
            yield first, i, rows
            first, rows, size = i, 0, 0
        rows += n
        size += b
    if rows:
        yield first, len(counts), rows


def check_schema(schema, columns: dict[str, str], source: str) -> None:
    """Each declared column is in ``schema`` (a pyarrow schema) with a type its kind accepts: ``int`` an integer
    type, ``float`` an integer, floating point or decimal type, ``str`` any type (it reaches the shard as text);
    a column of nulls only passes (every cell is missing), and a dictionary column is held by its values' type.
    InputRejected naming the first column that fails (``field``) and its type."""
    import pyarrow as pa

    names = schema.names
    missing = [c for c in columns if c not in names]
    if missing:
        raise InputRejected(f"{source}: lacks required columns {missing}; it has {names}", field=missing[0],
                            source=source)
    accepts = {"int": (pa.types.is_integer,),
               "float": (pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal)}
    for col, kind in columns.items():
        kind_type = schema.types[names.index(col)]
        value_type = kind_type.value_type if pa.types.is_dictionary(kind_type) else kind_type
        if kind == "str" or pa.types.is_null(value_type) or any(ok(value_type) for ok in accepts[kind]):
            continue
        raise InputRejected(f"{source}: column {col!r} is of type {kind_type}, not {kind}", field=col, source=source)
