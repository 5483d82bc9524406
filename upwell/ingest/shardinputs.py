"""A job's inputs into shards: a manifest's data refs (whole files, or row blocks) and an instrument drop
(row blocks by its rule, or one binary file passed through whole).

Each shard is a tuple (shard id, params, input blob, input sha256[, input range]), the form the ledger and
queue take. A row block the columnar reader checked, and a whole file, reference the upload at the version
ingest read (the range, ``upwell.shardref``): nothing is copied, and the agent takes the digest as it stages
the input in. A Parquet drop's shards are row groups of the upload at that version, found from its footer
alone (``upwell.ingest.parquetshards``). Rows rewritten by Python's csv module (quotes, UTF-16) are copied
under shards/<job>/.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from concurrent.futures import Future

from upwell import names
from upwell.blobfile import BlobFile
from upwell.documents import archive_kind
from upwell.errors import InputRejected, NotFound
from upwell.ingest import manifests
from upwell.ingest.badrows import collect as collect_bad_rows
from upwell.ingest.blobnames import check_name
from upwell.ingest.parquetshards import ParquetShard, parquet_shards
from upwell.ingest.sharding import CsvOptions, shard_csv
from upwell.ingest.shardwriter import Shard
from upwell.ingest.uploads import ShardUploads, prefetch
from upwell.payloads import params as payload_params
from upwell.settings import Settings
from upwell.shardref import ShardRef
from upwell.storage import BlobChunks, Storage


def _quiet(_sent: int) -> None:
    """No lease to renew (a manifest's data files, a check of a submission)."""


class InputSharder:
    """Reads a job's inputs and writes its shard blobs under shards/<job>/. Keeps handles to storage and
    settings (the upload and shard-count limits)."""

    def __init__(self, storage: Storage, settings: Settings):
        self.storage = storage
        self.settings = settings

    def data_refs(self, job_id: str, manifest_name: str, m: manifests.Manifest, spec):
        """The shards of a manifest's data refs, numbered on across the refs."""
        folder = manifest_name.rsplit("/", 1)[0] if "/" in manifest_name else ""
        index = 0
        for i, ref in enumerate(m.data):
            try:
                check_name(ref)
            except InputRejected as exc:
                raise InputRejected(f"data[{i}]: {exc.message}", field=f"data[{i}]", limit=exc.limit) from None
            local = f"{names.INCOMING}/{folder}/{ref}".replace("//", "/")
            path = ref if ref.startswith(f"{names.INCOMING}/") else local
            params = dict(m.params)
            payload_params.validate(spec.definition, params)
            if m.shard.whole_files:
                yield (f"s{index:05d}", params, path, "", self._whole_file(path, i))
                index += 1
                continue
            chunks = None if path.endswith(".parquet") else self._open(path)
            with ShardUploads(self.storage) as uploads:
                for shard in self._stream(path, chunks, m.shard, {}):
                    self._keep(uploads, job_id, index, shard, (f"s{index:05d}", dict(params)), path, chunks,
                               CsvOptions())
                    index += 1
            yield from uploads.shards

    def instrument(self, job_id: str, name: str, rule: manifests.PipelineRule,
                   opened: Future | None = None, beat: Callable[[int], None] = _quiet) -> list[tuple]:
        """The shards of the instrument drop incoming/<name> under ``rule``; ``opened``: its chunks already
        asked for. ``beat(0)`` is called as the read goes on (a shard cut, a chunk hashed): the ingest's lease
        renews itself there (``IngestLease.renew``, a write once a sixth of the lease has passed)."""
        source = f"{names.INCOMING}/{name}"
        if rule.format == "binary":
            return [("s00000", dict(rule.params), source, self._binary_sha256(name, opened, beat))]
        options = CsvOptions(rule.delimiter, rule.comment, tuple(rule.missing))
        chunks = None if rule.format == "parquet" else self._open(source, opened)
        with ShardUploads(self.storage) as uploads:
            for shard in self._stream(source, chunks, rule.shard, rule.columns, fmt=rule.format, options=options):
                self._keep(uploads, job_id, shard.index, shard, (f"s{shard.index:05d}", dict(rule.params)), source,
                           chunks, options)
                beat(0)
        return uploads.shards

    def _keep(self, uploads: ShardUploads, job_id: str, index: int, shard: Shard | ParquetShard, row: tuple,
              source: str, chunks: BlobChunks | None, options: CsvOptions) -> None:
        """A range of ``source`` at the version ``chunks`` read, or row groups of it (upwell.shardref), or a
        copy under shards/<job>/."""
        if isinstance(shard, ParquetShard):
            uploads.refer(source, row, shard.ref.to_dict())
            return
        if not shard.is_range:
            uploads.put(f"{names.SHARDS}/{job_id}/s{index:05d}.csv", shard.data, row)
            return
        ref = ShardRef(shard.offset, shard.length, chunks.etag, chunks.version_id, header=shard.header.decode(),
                       delimiter=options.delimiter, missing=options.missing, numeric=shard.numeric)
        uploads.refer(source, row, ref.to_dict())

    def _whole_file(self, path: str, i: int) -> dict:
        """One data file passed whole: a reference to it at its current version, never a copy nor read here
        (but for its first bytes, the archive check); the agent takes its digest as it stages it in."""
        try:
            props = self.storage.properties(path)
        except NotFound:
            raise InputRejected(f"data blob {path} does not exist", field=f"data[{i}]") from None
        if props.size > self.settings.max_upload_bytes:
            raise InputRejected(f"data[{i}] is {props.size} bytes; the limit is {self.settings.max_upload_bytes}",
                                field=f"data[{i}]", limit=f"max_upload_bytes={self.settings.max_upload_bytes}")
        head = b"".join(self.storage.chunks(path, etag=props.etag, offset=0, length=512)) if props.size else b""
        kind = archive_kind(head)
        if kind:
            raise InputRejected(f"data[{i}] is a {kind} archive; archives are not accepted: upload the files "
                                "themselves", field=f"data[{i}]")
        return ShardRef(0, props.size, props.etag, str(getattr(props, "version_id", None) or "")).to_dict()

    def _binary_sha256(self, name: str, opened: Future | None = None, beat: Callable[[int], None] = _quiet) -> str:
        """A binary file passes through whole: it is only read for its digest, never parsed or copied."""
        head, digest = b"", hashlib.sha256()
        for chunk in opened.result() if opened is not None else self.storage.chunks(f"{names.INCOMING}/{name}"):
            if len(head) < 512:
                head += chunk[:512]
            digest.update(chunk)
            beat(0)
        kind = archive_kind(head)
        if kind:
            raise InputRejected(f"incoming/{name[:200]} is a {kind} archive; archives are not accepted: upload the "
                                "files themselves", field="document")
        return digest.hexdigest()

    def _open(self, path: str, opened: Future | None = None) -> BlobChunks:
        """The chunks of ``path`` (``opened``: already asked for); a missing blob is bad input."""
        try:
            return opened.result() if opened is not None else self.storage.chunks(path)
        except NotFound:
            raise InputRejected(f"data blob {path} does not exist", field="data") from None

    def _stream(self, path: str, chunks: BlobChunks | None, rule: manifests.ShardRule, columns: dict,
                fmt: str = "", options: CsvOptions | None = None):
        """Shards of ``path``: CSV row blocks as ranges of it where the columnar reader checked them; a Parquet
        file's row groups (``chunks`` None: only its footer is read, at the version its properties name)."""
        fmt = fmt or ("parquet" if path.endswith(".parquet") else "csv")
        limit = self.settings.max_shards
        if fmt == "parquet":
            try:
                blob = BlobFile.pinned(self.storage, path)
            except NotFound:
                raise InputRejected(f"data blob {path} does not exist", field="data") from None
            yield from parquet_shards(blob, source=path, rows_per_shard=rule.rows, bytes_per_shard=rule.bytes,
                                      columns=columns, max_shards=limit)
            return
        try:
            yield from shard_csv(prefetch(chunks), source=path, rows_per_shard=rule.rows,
                                 bytes_per_shard=rule.bytes, columns=columns, max_shards=limit, options=options,
                                 refs=True)
        except InputRejected as exc:  # a bad row: the .error.json lists every one, up to a limit
            if exc.row and exc.field not in ("shard", "header", "document"):
                exc.rows, exc.more_rows = collect_bad_rows(self.storage.chunks(path), source=path, columns=columns,
                                                           options=options or CsvOptions(),
                                                           limit=self.settings.quarantine_max_rows)
            raise
