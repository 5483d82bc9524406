"""A job's inputs into shards: a manifest's data refs (whole files, or row blocks) and an instrument drop
(row blocks by its rule, or one binary file passed through whole).

Each shard is a tuple (shard id, params, input blob, input sha256), the form the ledger and queue take.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from concurrent.futures import Future
from pathlib import PurePosixPath

from upwell import names
from upwell.documents import archive_kind
from upwell.errors import InputRejected, NotFound
from upwell.ingest import manifests
from upwell.ingest.badrows import collect as collect_bad_rows
from upwell.ingest.blobnames import check_name
from upwell.ingest.sharding import CsvOptions, shard_csv, shard_parquet
from upwell.ingest.uploads import ShardUploads, prefetch
from upwell.payloads import params as payload_params
from upwell.settings import Settings
from upwell.storage import Storage


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
            if m.shard.whole_files:
                params = dict(m.params)
                payload_params.validate(spec.definition, params)
                blob_path, digest = self._whole_file(job_id, index, path, i)
                yield (f"s{index:05d}", params, blob_path, digest)
                index += 1
                continue
            with ShardUploads(self.storage) as uploads:
                for shard in self._stream(path, m.shard, {}):
                    params = dict(m.params)
                    payload_params.validate(spec.definition, params)
                    blob_path = f"{names.SHARDS}/{job_id}/s{index:05d}.csv"
                    uploads.put(blob_path, shard.data, (f"s{index:05d}", params))
                    index += 1
            yield from uploads.shards

    def instrument(self, job_id: str, name: str, rule: manifests.PipelineRule,
                   opened: Future | None = None) -> list[tuple]:
        """The shards of the instrument drop incoming/<name> under ``rule``; ``opened``: its chunks already
        asked for."""
        source = f"{names.INCOMING}/{name}"
        if rule.format == "binary":
            return [("s00000", dict(rule.params), source, self._binary_sha256(name, opened))]
        options = CsvOptions(rule.delimiter, rule.comment, tuple(rule.missing))
        with ShardUploads(self.storage) as uploads:
            for shard in self._stream(source, rule.shard, rule.columns, fmt=rule.format, options=options,
                                      opened=opened):
                blob_path = f"{names.SHARDS}/{job_id}/s{shard.index:05d}.csv"
                uploads.put(blob_path, shard.data, (f"s{shard.index:05d}", dict(rule.params)))
        return uploads.shards

    def _whole_file(self, job_id: str, index: int, path: str, i: int) -> tuple[str, str]:
        """Copy one data file unchanged to shards/<job>/sNNNNN<ext>; (blob path, sha256)."""
        name = path.split("/", 1)[1]
        try:
            data = self.storage.read(path)
        except NotFound:
            raise InputRejected(f"data blob {path} does not exist", field=f"data[{i}]") from None
        if len(data) > self.settings.max_upload_bytes:
            raise InputRejected(f"data[{i}] is {len(data)} bytes; the limit is {self.settings.max_upload_bytes}",
                                field=f"data[{i}]", limit=f"max_upload_bytes={self.settings.max_upload_bytes}")
        kind = archive_kind(data[:512])
        if kind:
            raise InputRejected(f"data[{i}] is a {kind} archive; archives are not accepted: upload the files "
                                "themselves", field=f"data[{i}]")
        suffix = PurePosixPath(name).suffix
        suffix = suffix if re.fullmatch(r"\.[A-Za-z0-9]{1,10}", suffix) else ""
        blob_path = f"{names.SHARDS}/{job_id}/s{index:05d}{suffix}"
        self.storage.write(blob_path, data)
        return blob_path, hashlib.sha256(data).hexdigest()

    def _binary_sha256(self, name: str, opened: Future | None = None) -> str:
        """A binary file passes through whole: it is only read for its digest, never parsed or copied."""
        head, digest = b"", hashlib.sha256()
        for chunk in opened.result() if opened is not None else self.storage.chunks(f"{names.INCOMING}/{name}"):
            if len(head) < 512:
                head += chunk[:512]
            digest.update(chunk)
        kind = archive_kind(head)
        if kind:
            raise InputRejected(f"incoming/{name[:200]} is a {kind} archive; archives are not accepted: upload the "
                                "files themselves", field="document")
        return digest.hexdigest()

    def _stream(self, path: str, rule: manifests.ShardRule, columns: dict, fmt: str = "",
                options: CsvOptions | None = None, opened: Future | None = None):
        """Shards of ``path``; ``opened``: its ``Storage.chunks`` already asked for (a NotFound is raised here)."""
        fmt = fmt or ("parquet" if path.endswith(".parquet") else "csv")
        limit = self.settings.max_shards
        try:
            chunks = opened.result() if opened is not None else self.storage.chunks(path)
        except NotFound:
            raise InputRejected(f"data blob {path} does not exist", field="data") from None
        if fmt == "parquet":
            with tempfile.NamedTemporaryFile(suffix=".parquet") as tmp:
                for chunk in chunks:
                    tmp.write(chunk)
                tmp.flush()
                yield from shard_parquet(tmp.name, source=path, rows_per_shard=rule.rows or 1000,
                                         columns=columns, max_shards=limit)
            return
        try:
            yield from shard_csv(prefetch(chunks), source=path, rows_per_shard=rule.rows,
                                 bytes_per_shard=rule.bytes, columns=columns, max_shards=limit, options=options)
        except InputRejected as exc:  # a bad row: the .error.json lists every one, up to a limit
            if exc.row and exc.field not in ("shard", "header", "document"):
                exc.rows, exc.more_rows = collect_bad_rows(self.storage.chunks(path), source=path, columns=columns,
                                                           options=options or CsvOptions(),
                                                           limit=self.settings.quarantine_max_rows)
            raise
