"""Ingest: validate an upload, shard it, write the ledger, enqueue one work item per shard.

Idempotent: the job id is derived from the blob's name and ETag, so a second
delivery of the same upload finds its job and only finishes what a crashed first
delivery left undone. Bad input is copied to quarantine/ beside an error file and
recorded in the ledger as a rejected job; nothing is deleted without a copy.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import tempfile
import unicodedata
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import PurePosixPath
from typing import Any

from upwell import logs, names
from upwell.documents import archive_kind
from upwell.errors import InputRejected, NotFound, UpwellError
from upwell.ingest import manifests
from upwell.ingest.sharding import CsvOptions, shard_csv, shard_parquet
from upwell.ingest.uploads import ShardUploads, prefetch
from upwell.ledger import JobRow, JobState, Ledger, ShardRow, ShardState
from upwell.messages import WorkItem, encode
from upwell.payloads import params as payload_params
from upwell.payloads.registry import Registry
from upwell.settings import Settings
from upwell.storage import Storage, dot_segments
from upwell.timeutil import now_iso

MAX_NAME = 1024
MANIFEST_NAMES = ("job.yaml", "job.yml", "job.json")
INPUT_FOLDER = "data"  # incoming/<x>/data/... are a manifest's inputs, never jobs themselves
ERROR_SUFFIX = ".error.json"
# Archives and compressed files are refused by name (and by content in manifests and sharding):
# upwell shards what it can see, and an archive would hide the files, their sizes and names.
ARCHIVE_SUFFIXES = (".zip", ".tar", ".tgz", ".tar.gz", ".gz", ".bz2", ".tbz2", ".xz", ".txz", ".7z", ".rar",
                    ".zst", ".lz4", ".lzma", ".z", ".jar", ".whl")

log = logs.get("upwell.ingest.ingestor")


@dataclass(frozen=True)
class Outcome:
    job_id: str
    status: str  # "accepted" | "duplicate" | "rejected" | "skipped"
    shards: int = 0
    message: str = ""


def check_name(name: str) -> None:
    """Refuse path names with '..', absolute paths, control characters or excessive length."""
    if len(name) > MAX_NAME:
        raise InputRejected(f"blob name is {len(name)} characters; the limit is {MAX_NAME}", field="name",
                            limit=f"max_name={MAX_NAME}")
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:[\\/]", name):
        raise InputRejected(f"blob name {name[:80]!r} is an absolute path", field="name")
    if any(part == ".." for part in re.split(r"[\\/]", name)):
        raise InputRejected(f"blob name {name[:80]!r} contains '..'", field="name")
    if any(part == "." for part in re.split(r"[\\/]", name)):
        raise InputRejected(f"blob name {name[:80]!r} contains a '.' path segment", field="name")
    if any(unicodedata.category(c) == "Cc" for c in name):
        raise InputRejected(f"blob name {name[:80]!r} contains control characters", field="name")
    if name.lower().endswith(ARCHIVE_SUFFIXES):
        raise InputRejected(f"{name.rsplit('/', 1)[-1][:80]!r} is an archive; archives are not accepted: upload the "
                            "files themselves (uncompressed)", field="name")


def job_id_for(name: str, etag: str) -> str:
    """Deterministic: '<slug of the name>-<12 hex of sha256(name, etag)>'."""
    digest = hashlib.sha256(f"{name}\n{etag}".encode()).hexdigest()[:12]
    stem = name.rsplit("/", 2)
    label = stem[-2] if stem[-1] in MANIFEST_NAMES and len(stem) > 1 else stem[-1].rsplit(".", 1)[0]
    slug = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")[:40] or "job"
    return f"{slug}-{digest}"


def is_manifest(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return base in MANIFEST_NAMES or base.endswith((".job.yaml", ".job.yml", ".job.json"))


def is_manifest_input(name: str) -> bool:
    return f"/{INPUT_FOLDER}/" in f"/{name}"


class Ingestor:
    """Ingests one incoming blob. Keeps handles to storage, the ledger and settings."""

    def __init__(self, storage: Storage, settings: Settings, ledger: Ledger | None = None):
        self.storage = storage
        self.settings = settings
        self.ledger = ledger or Ledger(storage)
        self.definitions = Registry(storage, settings.registry_allowlist)

    def ingest(self, name: str) -> Outcome:
        """Ingest incoming/<name>. Raises only upwell errors; transient ones so the host redelivers.

        An instrument drop's rule is looked up (payload names, the rule listing and files) in a thread while
        this one reads the blob's properties and its job row: they do not depend on each other. Once the job
        row says it is not a duplicate, the download starts while the rule may still be read. Answers, or
        errors, are taken where they are needed, so errors come in the same order as one by one."""
        with ThreadPoolExecutor(max_workers=6, thread_name_prefix="ingest-read") as reads:
            rule = reads.submit(self.match_rule, name, reads) if _instrument_drop(name) else None
            return self._ingest(name, rule, reads)

    def _ingest(self, name: str, rule: Future | None, reads: ThreadPoolExecutor) -> Outcome:
        try:
            props = self.storage.properties(f"{names.INCOMING}/{name}")
        except NotFound:
            return Outcome("", "skipped", message=f"incoming/{name} is gone")
        job_id = job_id_for(name, props.etag)
        bound = log.bind(job_id=job_id, blob=f"{names.INCOMING}/{name}")
        try:
            check_name(name)
            if is_manifest_input(name) and not is_manifest(name):
                bound.info("ingest.input_for_manifest")
                self._wake_waiting(name)
                return Outcome(job_id, "skipped", message="input of a manifest")
            if props.size > self.settings.max_upload_bytes:
                raise InputRejected(f"upload is {props.size} bytes; the limit is {self.settings.max_upload_bytes}",
                                    field="size", limit=f"max_upload_bytes={self.settings.max_upload_bytes}")
            existing = self.ledger.job(job_id)
            if existing and existing.status not in (JobState.INGESTING, JobState.WAITING):
                bound.info("ingest.duplicate", status=existing.status.value)
                return Outcome(job_id, "duplicate", existing.shards_total)
            try:
                if is_manifest(name):
                    return self._manifest(job_id, name, props, bound)
                opened = reads.submit(self.storage.chunks, f"{names.INCOMING}/{name}") if rule else None
                return self._instrument(job_id, name, props, bound, rule, reads, opened)
            except (ValueError, RecursionError) as exc:  # the input broke a parser: still bad input
                bound.exception("ingest.unreadable")
                raise InputRejected(f"incoming/{name[:200]} cannot be read: {type(exc).__name__}: "
                                    f"{str(exc)[:300]}", field="document") from None
        except InputRejected as exc:
            exc.source = exc.source or f"{names.INCOMING}/{name}"
            self.quarantine(job_id, name, props.etag, exc)
            bound.warning("ingest.rejected", error=exc.message, field=exc.field, row=exc.row)
            return Outcome(job_id, "rejected", message=exc.message)

    # -- manifests ---------------------------------------------------------------
    def _manifest(self, job_id: str, name: str, props, bound) -> Outcome:
        data = self.storage.read(f"{names.INCOMING}/{name}")
        m = manifests.load_manifest(data, f"{names.INCOMING}/{name}", self.definitions.names())
        spec = self.definitions.resolve(m.payload)
        pool = m.pool or spec.definition.pool
        self._check_pool(pool, "pool")
        if m.image and m.image not in self.settings.image_allowlist:
            raise InputRejected(f"image {m.image!r} is not on the allowlist {list(self.settings.image_allowlist)}",
                                field="image")
        job = self._job_row(job_id, name, props, m, pool, manifests.manifest_hash(data), spec)
        missing = [ref for ref in m.data if not self._data_exists(name, ref)]
        if missing:
            return self._wait_for_data(job, props, m, missing, bound)
        if m.data:
            shards = list(self._shard_data_refs(job_id, name, m, spec))
        else:
            points = manifests.grid_points(m, self.settings.max_shards, self.settings.max_param_bytes,
                                           spec.definition)
            shards = [(f"s{i:05d}", p, None, hashlib.sha256(json.dumps(p, sort_keys=True).encode()).hexdigest())
                      for i, p in enumerate(points)]
        return self._dispatch(job, shards, spec, self._resources(m, spec.definition), bound)

    @staticmethod
    def _resources(m: manifests.Manifest, definition) -> manifests.Resources:
        """The manifest's resources, else the definition's ranks and GPUs."""
        if "resources" in m.model_fields_set:
            return m.resources
        return manifests.Resources(ranks=definition.resources.ranks, gpus=definition.resources.gpus)

    # -- a manifest that came before its data ------------------------------------------
    @staticmethod
    def _data_path(manifest_name: str, ref: str) -> str:
        folder = manifest_name.rsplit("/", 1)[0] if "/" in manifest_name else ""
        return ref if ref.startswith(f"{names.INCOMING}/") else f"{names.INCOMING}/{folder}/{ref}".replace("//", "/")

    def _data_exists(self, manifest_name: str, ref: str) -> bool:
        try:
            check_name(ref)
        except InputRejected:
            return True  # named wrongly: sharding rejects it with the field; waiting would not help
        return self.storage.exists(self._data_path(manifest_name, ref))

    def _wait_for_data(self, job: dict, props, m: manifests.Manifest, missing: list[str], bound) -> Outcome:
        """Storage Explorer drops a folder in no set order: keep the job "waiting" until its data blobs are
        in (each arrival, and the timer, ingest the manifest again), for data_wait_s after the upload."""
        waited = (datetime.now(UTC) - props.last_modified).total_seconds() if props.last_modified else 0.0
        grace = self.settings.data_wait_s
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        if waited >= grace:
            i = m.data.index(missing[0])
            where = self._data_path(job["source_blob"][len(names.INCOMING) + 1:], missing[0])
            raise InputRejected(f"data blob {where} does not exist (missing: {shown}; waited {waited:.0f} s, "
                                f"the limit is {grace} s)", field=f"data[{i}]", limit=f"data_wait_s={grace}")
        until = (props.last_modified + timedelta(seconds=grace)).isoformat(timespec="seconds").replace("+00:00", "Z")
        message = (f"waiting for data blobs: {shown} ({len(m.data) - len(missing)} of {len(m.data)} present); "
                   f"gives up at {until}")
        row = {**job, "status": JobState.WAITING.value, "message": message, "wait_until": until, "shards_total": 0}
        _, created = self.ledger.create_job(JobRow.from_entity(row))
        if not created:
            self.ledger.update_job(job["job_id"], message=message, wait_until=until)
        bound.info("ingest.waiting_for_data", missing=len(missing), until=until)
        return Outcome(job["job_id"], "waiting", message=message)

    def _wake_waiting(self, data_name: str) -> None:
        """A data blob arrived: ingest again each waiting manifest in the folder that holds its data/."""
        folder = f"/{data_name}".rsplit(f"/{INPUT_FOLDER}/", 1)[0].lstrip("/")
        prefix = f"{folder}/" if folder else ""
        for blob in self.storage.list(names.INCOMING, prefix):
            rest = blob.name[len(prefix):]
            if "/" in rest or not is_manifest(blob.name):
                continue
            etag = blob.etag if str(blob.etag).startswith('"') else f'"{blob.etag}"'
            found = self.ledger.job(job_id_for(blob.name, etag))
            if found is not None and found.status == JobState.WAITING:
                self.ingest(blob.name)

    def _shard_data_refs(self, job_id: str, manifest_name: str, m: manifests.Manifest, spec):
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
                for shard in self._shard_stream(path, m.shard, {}, len(m.data)):
                    params = dict(m.params)
                    payload_params.validate(spec.definition, params)
                    blob_path = f"{names.SHARDS}/{job_id}/s{index:05d}.csv"
                    uploads.put(blob_path, shard.data, (f"s{index:05d}", params))
                    index += 1
            yield from uploads.shards

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

    # -- instrument drops ----------------------------------------------------------
    def _instrument(self, job_id: str, name: str, props, bound, matched: Future | None = None,
                    reads: ThreadPoolExecutor | None = None, opened: Future | None = None) -> Outcome:
        rule = matched.result() if matched is not None else self.match_rule(name)
        spec = self.definitions.resolve(rule.payload)
        pool = rule.pool or spec.definition.pool
        self._check_pool(pool, "pool")
        payload_params.validate(spec.definition, dict(rule.params))
        m = manifests.Manifest(name=f"{rule.name or 'rule'}: {name}", payload=rule.payload, pool=pool,
                               params=rule.params, shard=rule.shard, estimate=rule.estimate,
                               budget_usd=rule.budget_usd, spot=rule.spot, max_concurrency=rule.max_concurrency,
                               owner=rule.owner, project=rule.project, max_wall_clock_s=rule.max_wall_clock_s,
                               max_shard_wall_clock_s=rule.max_shard_wall_clock_s)
        job = self._job_row(job_id, name, props, m, pool, manifests.manifest_hash(rule.model_dump_json().encode()),
                            spec)
        source = f"{names.INCOMING}/{name}"
        history = reads.submit(self._history, job) if reads is not None else None  # read while the file is parsed
        if rule.format == "binary":
            shards = [("s00000", dict(rule.params), source, self._binary_sha256(name, opened))]
            return self._dispatch(job, shards, spec, manifests.Resources(), bound, history)
        options = CsvOptions(rule.delimiter, rule.comment, tuple(rule.missing))
        with ShardUploads(self.storage) as uploads:
            for shard in self._shard_stream(source, rule.shard, rule.columns, 1, fmt=rule.format, options=options,
                                            opened=opened):
                blob_path = f"{names.SHARDS}/{job_id}/s{shard.index:05d}.csv"
                uploads.put(blob_path, shard.data, (f"s{shard.index:05d}", dict(rule.params)))
        return self._dispatch(job, uploads.shards, spec, manifests.Resources(), bound, history)

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

    def match_rule(self, name: str, reads: ThreadPoolExecutor | None = None) -> manifests.PipelineRule:
        """The first rule, in listing order, that loads and matches ``name``. With ``reads``, the payload names
        and the listing are read at once and the rule files a few ahead (errors as one by one: a file after the
        match is never looked at)."""
        known_f = reads.submit(self.definitions.names) if reads is not None else None
        items = [i.name for i in self.storage.list(names.PIPELINES) if i.name.endswith((".yaml", ".yml", ".json"))]
        rules, known = [], known_f.result() if known_f is not None else self.definitions.names()
        for item, data in _ahead(reads, lambda n: self.storage.read(f"{names.PIPELINES}/{n}"), items):
            try:
                rule = manifests.load_rule(data(), f"{names.PIPELINES}/{item}", known)
            except InputRejected as exc:
                log.warning("ingest.bad_rule", rule=item, error=exc.message)
                continue
            rules.append(rule)
            if rule.matches(name):
                return rule
        known = ", ".join(r.match for r in rules) or "none"
        raise InputRejected(f"no pipeline rule matches incoming/{name} (rules: {known}), and it is not a job "
                            f"manifest (job.yaml / job.json)", field="name")

    def _shard_stream(self, path: str, rule: manifests.ShardRule, columns: dict, n_sources: int, fmt: str = "",
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
        yield from shard_csv(prefetch(chunks), source=path, rows_per_shard=rule.rows,
                             bytes_per_shard=rule.bytes, columns=columns, max_shards=limit, options=options)

    # -- ledger and queue -------------------------------------------------------------
    def _check_pool(self, pool: str, field: str) -> None:
        if pool not in self.settings.pools:
            raise InputRejected(f"pool {pool!r} is not configured; pools: {sorted(self.settings.pools)}",
                                field=field)

    def _job_row(self, job_id, name, props, m: manifests.Manifest, pool: str, mhash: str, spec) -> dict[str, Any]:
        from upwell.cost.wallclock import tighter

        pspec = self.settings.pools[pool]
        d = spec.definition
        return {"job_id": job_id, "name": m.name or name, "description": m.description, "status": "ingesting",
                "payload": d.name, "payload_version": d.version, "payload_sha256": spec.sha256,
                "payload_image": d.image, "pool": pool, "source_blob": f"{names.INCOMING}/{name}",
                "source_etag": props.etag, "owner": m.owner or _uploader(props) or "unknown",
                "project": m.project or self.settings.project, "gpus": m.resources.gpus,
                "max_wall_clock_s": tighter(m.max_wall_clock_s, pspec.max_wall_clock_s),
                "max_shard_wall_clock_s": tighter(m.max_shard_wall_clock_s, pspec.max_shard_wall_clock_s),
                "manifest_hash": mhash, "created_at": now_iso(), "budget_usd": m.budget_usd, "spot": m.spot,
                "price_key": pspec.price_key, "estimate_node_seconds_per_shard": m.estimate.node_seconds_per_shard,
                "ranks": m.resources.ranks, "max_concurrency": m.max_concurrency,
                "shards_done": 0, "shards_failed": 0, "spent_usd": 0.0,
                "code_version": self.settings.code_version}

    def _dispatch(self, job: dict, shards: list[tuple], spec, resources, bound,
                  history: Future | None = None) -> Outcome:
        job_id = job["job_id"]
        if not shards:
            raise InputRejected("the job has no shards", field="grid")
        if len(shards) > self.settings.max_shards:
            raise InputRejected(f"the job has {len(shards)} shards; the limit is {self.settings.max_shards}",
                                field="shard", limit=f"max_shards={self.settings.max_shards}")
        est = self._estimate(job, [params for _, params, _, _ in shards], resources,
                             history.result() if history is not None else None)
        est_ns, est_usd = est.node_seconds, est.usd
        job.update(shards_total=len(shards), estimate_node_seconds=est_ns, estimate_usd=est_usd,
                   node_share=est.share, estimate_spot_fraction=est.spot_fraction, estimate_basis=est.basis)
        from upwell.cost.budgets import check_budgets

        check_budgets(self.ledger, self.settings, owner=job["owner"], project=job["project"], estimate_usd=est_usd)
        if job["budget_usd"] is not None and est_usd > job["budget_usd"]:
            raise InputRejected(f"estimated cost ${est_usd:.2f} ({est_ns:.0f} node-seconds on {job['price_key']}) "
                                f"exceeds the budget ${job['budget_usd']:.2f}", field="budget_usd",
                                limit=f"budget_usd={job['budget_usd']}")
        items = [WorkItem(job_id=job_id, shard_id=sid, payload=spec.definition.name, pool=job["pool"], params=params,
                          payload_version=spec.definition.version, payload_sha256=spec.sha256,
                          input_blob=blob, checkpoint_prefix=f"{names.CHECKPOINTS}/{job_id}/{sid}/",
                          result_prefix=f"{names.RESULTS}/{job_id}/{sid}", ranks=resources.ranks,
                          gpus=resources.gpus) for sid, params, blob, _ in shards]
        texts = [encode(i, self.settings.max_message_bytes) for i in items]  # size errors before any effect
        _, created = self.ledger.create_job(JobRow.from_entity(job))
        if not created:  # a row left by an earlier delivery, or by the wait for data: now it is the job
            fields = {k: v for k, v in job.items() if k not in ("status", "job_id")}
            self.ledger.update_job(job_id, **fields, message="")
        now = now_iso()
        self.ledger.add_shards(job_id, [
            ShardRow(job_id=job_id, shard_id=sid, status=ShardState.QUEUED, queued_at=now, pool=job["pool"],
                     params=json.dumps(params, sort_keys=True), input_blob=blob or "", input_sha256=digest,
                     result_blob=f"{names.RESULTS}/{job_id}/{sid}.json")
            for sid, params, blob, digest in shards])
        queue = names.work_queue(job["pool"])
        if len(texts) < 4:
            for text in texts:
                self.storage.send(queue, text)
        else:  # one round trip each: in parallel (a sweep of thousands would take minutes one by one)
            with ThreadPoolExecutor(max_workers=8, thread_name_prefix="enqueue") as pool:
                for _ in pool.map(lambda text: self.storage.send(queue, text), texts):
                    pass
        self.ledger.update_job(job_id, status=JobState.ACCEPTED, accepted_at=now_iso())
        bound.info("ingest.accepted", shards=len(items), pool=job["pool"], payload=spec.ref,
                   estimate_usd=round(est_usd, 4))
        return Outcome(job_id, "accepted", len(items))

    def _history(self, job: dict):
        """Node time learned from earlier results of the job's payload on its pool (upwell.cost.forecast)."""
        from upwell.cost import forecast as est

        return est.learn(self.ledger, job["payload"], job["pool"])

    def _estimate(self, job: dict, points: list[dict], resources, history=None):
        """Priced on the pool that runs it, node time learned from earlier results (``_history``)."""
        from upwell.cost import forecast as est

        history = history if history is not None else self._history(job)
        return est.estimate(points, history=history, manifest_s=job["estimate_node_seconds_per_shard"],
                            price_key=job["price_key"], spot_allowed=bool(job["spot"]),
                            pool_spot_share=self.settings.pools[job["pool"]].spot_share,
                            ranks=resources.ranks, gpus=resources.gpus)

    # -- quarantine ---------------------------------------------------------------------
    def quarantine(self, job_id: str, name: str, etag: str, exc: InputRejected) -> None:
        """Copy the upload to quarantine/<name> beside <name>.error.json, then remove the original."""
        fits = len(name) + len(ERROR_SUFFIX) <= MAX_NAME
        safe = name if _printable(name) and fits else f"rejected/{job_id}"
        error = {**exc.to_dict(), "job_id": job_id, "blob": f"{names.INCOMING}/{name!r}"[:2000],
                 "etag": etag, "rejected_at": now_iso()}
        src = f"{names.INCOMING}/{name}"
        try:
            self.storage.write(f"{names.QUARANTINE}/{safe}", self.storage.chunks(src, etag=etag),
                               metadata={"source_etag": etag.strip('"')})
        except NotFound:
            pass  # already moved by an earlier delivery
        self.storage.write(f"{names.QUARANTINE}/{safe}{ERROR_SUFFIX}", json.dumps(error, indent=2).encode(),
                           content_type="application/json")
        self.ledger.create_job(JobRow(job_id=job_id, name=name[:200], status=JobState.REJECTED, message=exc.message,
                                      error_field=exc.field, error_row=exc.row, source_blob=f"incoming/{name}"[:1000],
                                      quarantine_blob=f"{names.QUARANTINE}/{safe}", created_at=now_iso()))
        self.ledger.update_job(job_id, status=JobState.REJECTED, message=exc.message)
        try:
            self.storage.delete(src, etag=etag)
        except UpwellError as err:  # the ETag no longer matches (a newer upload under the same name stays), it
            # is gone, or storage failed: the copy is made and the job rejected; the original may stay.
            log.info("ingest.quarantine_kept_original", reason=type(err).__name__)


def recheck_waiting(storage: Storage, settings: Settings, ledger: Ledger | None = None) -> list[str]:
    """The timer's part: ingest every waiting manifest again (it goes on, waits on, or is rejected when its
    grace is over). A manifest removed meanwhile ends its job as rejected."""
    ledger = ledger or Ledger(storage)
    ingestor = Ingestor(storage, settings, ledger)
    seen = []
    for job in ledger.jobs(JobState.WAITING):
        source = job.source_blob
        out = ingestor.ingest(source[len(names.INCOMING) + 1:]) if source.startswith(f"{names.INCOMING}/") else None
        if out is None or out.status == "skipped":
            ledger.update_job(job.job_id, status=JobState.REJECTED,
                              message="the manifest was removed while it waited for its data")
        seen.append(job.job_id)
    return seen


def _instrument_drop(name: str) -> bool:
    """Whether ``name`` can only be an instrument drop (a pipeline rule decides what it is)."""
    try:
        check_name(name)
    except InputRejected:
        return False
    return not is_manifest(name) and not is_manifest_input(name)


def _ahead(pool: ThreadPoolExecutor | None, read, items: list[str], depth: int = 4):
    """(item, result getter) in order; with ``pool``, up to ``depth`` reads run ahead of the caller."""
    if pool is None:
        for item in items:
            yield item, functools.partial(read, item)
        return
    futures = [pool.submit(read, item) for item in items[:depth]]
    for k, item in enumerate(items):
        if k + depth < len(items):
            futures.append(pool.submit(read, items[k + depth]))
        yield item, futures[k].result


def _printable(name: str) -> bool:
    return not any(unicodedata.category(c) == "Cc" for c in name) and not dot_segments(name) \
        and not name.startswith("/")


def _uploader(props) -> str:
    """Who uploaded, where the upload says: blob metadata ``uploaded_by`` (upwell submit sets it)."""
    meta = getattr(props, "metadata", None) or {}
    return str(meta.get("uploaded_by") or meta.get("upwell_owner") or "")[:200]
