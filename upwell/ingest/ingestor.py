"""Ingest: validate an upload, shard it, write the ledger, enqueue one work item per shard.

Idempotent: the job id is derived from the blob's name and ETag, so a second
delivery of the same upload finds its job: while the first holds the job row's lease
(upwell.ingest.lease) it does nothing; once that lease has lapsed (a crashed host) it
takes it over and only finishes what the first left undone. Bad input is copied to quarantine/ beside an error file and
recorded in the ledger as a rejected job; nothing is deleted without a copy.

This module holds the flow; its steps live beside it: the name rules (``blobnames``), the pipeline rule
lookup (``rulematch``), a manifest's wait for its data (``datawait``), inputs into shards
(``shardinputs``), the job's rows and queue (``accept``) and quarantine (``quarantine``).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from upwell import logs, names
from upwell.access.tags import folder_project
from upwell.after import notify as after_notify
from upwell.after import spec as after_spec
from upwell.after.gate import gate
from upwell.documents import check_size
from upwell.errors import IngestLeased, InputRejected, NotFound
from upwell.ingest import blocks, heap, lease, manifests
from upwell.ingest.accept import JobAcceptor
from upwell.ingest.blobnames import check_name, instrument_drop, is_manifest, is_manifest_input, job_id_for
from upwell.ingest.datawait import data_exists, wait_for_data, waiting_manifests
from upwell.ingest.fanout import GridShards
from upwell.ingest.quarantine import quarantine
from upwell.ingest.rulematch import match_rule
from upwell.ingest.shardinputs import InputSharder
from upwell.ledger import JobRow, JobState, Ledger
from upwell.payloads import params as payload_params
from upwell.payloads.registry import Registry
from upwell.settings import Settings
from upwell.storage import Storage

log = logs.get("upwell.ingest.ingestor")


@dataclass(frozen=True)
class Outcome:
    """What ingesting one blob came to."""

    job_id: str
    status: str  # "accepted" | "duplicate" | "rejected" | "skipped" | "waiting" | "leased"
    shards: int = 0
    message: str = ""


class Ingestor:
    """Ingests one incoming blob. Keeps handles to storage, the ledger, settings and the payload registry."""

    def __init__(self, storage: Storage, settings: Settings, ledger: Ledger | None = None):
        self.storage = storage
        self.settings = settings
        self.ledger = ledger or Ledger(storage)
        self.definitions = Registry(storage, settings.registry_allowlist)
        self.acceptor = JobAcceptor(storage, settings, self.ledger)
        heap.one_arena()  # before this process's first read of a drop (upwell.ingest.heap)

    def ingest(self, name: str) -> Outcome:
        """Ingest incoming/<name>. Raises only upwell errors; transient ones so the host redelivers.

        An instrument drop's rule is looked up (payload names, the rule listing and files) in a thread while
        this one reads the blob's properties and its job row: they do not depend on each other. Once the job
        row says it is not a duplicate, the download starts while the rule may still be read. Answers, or
        errors, are taken where they are needed, so errors come in the same order as one by one."""
        with ThreadPoolExecutor(max_workers=6, thread_name_prefix="ingest-read") as reads:
            drop = instrument_drop(name)
            rule = reads.submit(match_rule, self.storage, self.definitions, name, reads) if drop else None
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
            if existing and lease.live(existing, time.time(), self.settings.ingest_lease_s):
                return self._leased(job_id, bound, "another ingest holds the job row's lease")
            try:
                if is_manifest(name):
                    return self._manifest(job_id, name, props, bound)
                # a Parquet drop is read by its footer and row groups, never from the start (parquetshards)
                opened = reads.submit(self.storage.chunks, f"{names.INCOMING}/{name}") \
                    if rule and not name.endswith(".parquet") else None
                return self._instrument(job_id, name, props, bound, rule, reads, opened)
            except IngestLeased as exc:  # the check above raced another delivery: it goes on, this one stops
                return self._leased(job_id, bound, str(exc))
            except (ValueError, RecursionError) as exc:  # the input broke a parser: still bad input
                bound.exception("ingest.unreadable")
                raise InputRejected(f"incoming/{name[:200]} cannot be read: {type(exc).__name__}: "
                                    f"{str(exc)[:300]}", field="document") from None
        except InputRejected as exc:
            exc.source = exc.source or f"{names.INCOMING}/{name}"
            quarantine(self.storage.for_project(folder_project(name) or self.settings.project), self.ledger,
                       job_id, name, props.etag, exc)
            bound.warning("ingest.rejected", error=exc.message, field=exc.field, row=exc.row)
            after_notify.quarantined(self.storage, self.ledger, job_id, name)  # if it asked to be told
            return Outcome(job_id, "rejected", message=exc.message)

    @staticmethod
    def _leased(job_id: str, bound, message: str) -> Outcome:
        """A live ingest of the same upload holds the job: this delivery does nothing (upwell.ingest.lease)."""
        bound.info("ingest.leased", detail=message)
        return Outcome(job_id, "leased", message=message)

    # -- manifests ---------------------------------------------------------------
    def _manifest(self, job_id: str, name: str, props, bound) -> Outcome:
        check_size(props.size, f"{names.INCOMING}/{name}")  # the upload limit fits data drops, not documents
        data = self.storage.read(f"{names.INCOMING}/{name}")
        m = manifests.load_manifest(data, f"{names.INCOMING}/{name}", self.definitions.names())
        spec = self.definitions.resolve(m.payload)
        pool = m.pool or spec.definition.pool
        self.acceptor.check_pool(pool, "pool")
        if m.image and m.image not in self.settings.image_allowlist:
            raise InputRejected(f"image {m.image!r} is not on the allowlist {list(self.settings.image_allowlist)}",
                                field="image")
        job = self.acceptor.job_row(job_id, name, props, m, pool, manifests.manifest_hash(data), spec)
        job.update(after_spec.row_fields(m.after, m.reduce or spec.definition.reduce, m.notify))
        chained = gate(self.ledger, job)  # after: <job>: go with its results, wait for it, or cancelled
        if chained.kind != "go":
            return Outcome(job_id, chained.kind, message=chained.message)
        missing = [ref for ref in m.data if not data_exists(self.storage, name, ref)]
        if missing:
            message = wait_for_data(self.ledger, self.settings, job, props, m, missing, bound)
            return Outcome(job["job_id"], "waiting", message=message)
        if m.data:
            shards = list(self._sharder(job).data_refs(job_id, name, m, spec))
        else:
            folder = f"{names.RESULTS}/{chained.parent}/" if chained.parent else None  # the parent's results
            k, fit = blocks.size_for(m, self.settings.block_target_s, self.settings.block_max)
            shards = GridShards(m, self.settings.max_shards, self.settings.max_param_bytes, spec.definition,
                                input_blob=folder, k=k, fit=fit)
        count = self.acceptor.accept(job, shards, spec, self._resources(m, spec.definition), bound)
        return Outcome(job_id, "accepted", count)

    def _sharder(self, job: dict) -> InputSharder:
        """The sharder that writes the job's shard blobs with its project's index tag."""
        return InputSharder(self.storage.for_project(job["project"]), self.settings)

    @staticmethod
    def _resources(m: manifests.Manifest, definition) -> manifests.Resources:
        """The definition's resources, each field the manifest gives instead taken from the manifest;
        ``ranks_per_node`` resolved into ``ranks`` (upwell.shape)."""
        from upwell import shape

        d = definition.resources
        asked = {"ranks": d.ranks, "gpus": d.gpus, "nodes": d.nodes, "ranks_per_node": d.ranks_per_node,
                 "oversubscribe": d.oversubscribe}
        given = m.resources.model_fields_set if "resources" in m.model_fields_set else set()
        if "ranks" in given and "ranks_per_node" not in given:
            asked["ranks_per_node"] = None  # the manifest's total replaces the definition's per-node count
        asked.update({k: getattr(m.resources, k) for k in given})
        s = shape.resolve(nodes=asked["nodes"], ranks=asked["ranks"], ranks_per_node=asked["ranks_per_node"],
                          oversubscribe=asked["oversubscribe"])
        return manifests.Resources(ranks=s.ranks, gpus=asked["gpus"], nodes=s.nodes, oversubscribe=s.oversubscribe)

    def _wake_waiting(self, data_name: str) -> None:
        """A data blob arrived: ingest again each waiting manifest in the folder that holds its data/."""
        for manifest in waiting_manifests(self.storage, self.ledger, data_name):
            self.ingest(manifest)

    # -- instrument drops ----------------------------------------------------------
    def _instrument(self, job_id: str, name: str, props, bound, matched: Future | None = None,
                    reads: ThreadPoolExecutor | None = None, opened: Future | None = None) -> Outcome:
        rule = matched.result() if matched is not None else match_rule(self.storage, self.definitions, name)
        spec = self.definitions.resolve(rule.payload)
        pool = rule.pool or spec.definition.pool
        self.acceptor.check_pool(pool, "pool")
        payload_params.validate(spec.definition, dict(rule.params))
        m = manifests.Manifest(name=f"{rule.name or 'rule'}: {name}", payload=rule.payload, pool=pool,
                               params=rule.params, shard=rule.shard, estimate=rule.estimate,
                               budget_usd=rule.budget_usd, spot=rule.spot, max_concurrency=rule.max_concurrency,
                               owner=rule.owner, project=rule.project, max_wall_clock_s=rule.max_wall_clock_s,
                               max_shard_wall_clock_s=rule.max_shard_wall_clock_s)
        job = self.acceptor.job_row(job_id, name, props, m, pool,
                                    manifests.manifest_hash(rule.model_dump_json().encode()), spec)
        job.update(after_spec.row_fields(None, spec.definition.reduce, rule.notify))
        held = self.acceptor.open_read(job)  # the job shows, and holds its lease, while the drop is read
        if held is None:
            return Outcome(job_id, "duplicate", message="the job moved on while this delivery started")
        try:
            # the node-time history is read while the file is parsed
            history = reads.submit(self.acceptor.history, job) if reads is not None else None
            shards = self._sharder(job).instrument(job_id, name, rule, opened, beat=held[0].renew)
        except (InputRejected, IngestLeased):
            raise  # a refused drop's row becomes its rejection (quarantine); a lease taken over is not ours
        except Exception:
            held[0].release()
            raise
        count = self.acceptor.accept(job, shards, spec, manifests.Resources(), bound, history, opened=held)
        return Outcome(job_id, "accepted", count)


def recheck_waiting(storage: Storage, settings: Settings, ledger: Ledger | None = None,
                    open_rows: list[JobRow] | None = None) -> list[str]:
    """The timer's part: ingest every waiting manifest again (it goes on, waits on, or is rejected when its
    grace is over). A manifest removed meanwhile ends its job as rejected. ``open_rows``: the open jobs the
    caller has just read (the scale timer's autoscaler did); read through the ledger's index when not given."""
    ledger = ledger or Ledger(storage)
    ingestor = Ingestor(storage, settings, ledger)
    seen = []
    rows = ledger.open_jobs() if open_rows is None else open_rows  # the index of open jobs: no table scan
    for job in (j for j in rows if j.status == JobState.WAITING):
        source = job.source_blob
        out = ingestor.ingest(source[len(names.INCOMING) + 1:]) if source.startswith(f"{names.INCOMING}/") else None
        if out is None or out.status == "skipped":
            ledger.update_job(job.job_id, status=JobState.REJECTED,
                              message="the manifest was removed while it waited for its data")
        seen.append(job.job_id)
    return seen
