"""Accepting a job: its ledger row, the price estimate and budget checks, its shard rows, one work item per
shard on the pool's queue.

Every check (pool, shard count, budgets, message size) runs before any effect; a job row left by an earlier
delivery, or by the wait for data, becomes the job. The ingest holds the job row's lease while it writes
(upwell.ingest.lease); a re-drive takes a lapsed lease over and resumes: its merge leaves the counters
(``shards_done``, ``shards_failed``, ``spent_usd``) and ``created_at`` as they are, and it sends only the work
items that had not gone out (past the lease's ``ingest_sent``, and whose shard row is still queued; a message
sent twice is harmless, since collect counts a shard once).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable, Iterable, Iterator, Sized
from concurrent.futures import Future
from typing import Any

from upwell import counters, names
from upwell.access.tags import job_project
from upwell.errors import InputRejected
from upwell.ingest import blocks, manifests
from upwell.ingest.fanout import send_in_order
from upwell.ingest.lease import IngestLease
from upwell.ledger import JobRow, Ledger, ShardRow, ShardState
from upwell.messages import WorkItem, compact_etag, encode, expand_etag
from upwell.settings import Settings
from upwell.storage import Storage
from upwell.timeutil import now_iso

# Never lowered by a re-drive's merge, nor moved: the job's progress and its age.
KEPT = frozenset({"job_id", "status", "shards_done", "shards_failed", "spent_usd", "created_at"})
# The estimate, known once every point was read: written with the job's move to "accepted".
ESTIMATE = ("estimate_node_seconds", "estimate_usd", "node_share", "estimate_spot_fraction", "estimate_basis")
ROWS_PER_BEAT = 1000  # shard rows written between two chances to renew the lease
# A test seam: called with each work item's index just before it is sent (the fault tests slow or stop the
# enqueue with it, as a slow account or a crashed host would). None in production.
SEND_HOOK: Callable[[int], None] | None = None


class JobAcceptor:
    """Writes an accepted job to the ledger and its queue. Keeps handles to storage, settings and the ledger."""

    def __init__(self, storage: Storage, settings: Settings, ledger: Ledger):
        self.storage = storage
        self.settings = settings
        self.ledger = ledger

    def check_pool(self, pool: str, field: str) -> None:
        """Refuse a pool that is not configured."""
        if pool not in self.settings.pools:
            raise InputRejected(f"pool {pool!r} is not configured; pools: {sorted(self.settings.pools)}",
                                field=field)

    def job_row(self, job_id, name, props, m: manifests.Manifest, pool: str, mhash: str, spec) -> dict[str, Any]:
        """The job row's fields before its shards are known (status "ingesting")."""
        from upwell.cost.wallclock import tighter

        pspec = self.settings.pools[pool]
        d = spec.definition
        return {"job_id": job_id, "name": m.name or name, "description": m.description, "status": "ingesting",
                "payload": d.name, "payload_version": d.version, "payload_sha256": spec.sha256,
                "payload_image": d.image, "pool": pool, "source_blob": f"{names.INCOMING}/{name}",
                "source_etag": props.etag, "owner": m.owner or _uploader(props) or "unknown",
                "project": job_project(name, m.project, self.settings.project, strict=self.settings.project_folders),
                "gpus": m.resources.gpus,
                "max_wall_clock_s": tighter(m.max_wall_clock_s, pspec.max_wall_clock_s),
                "max_shard_wall_clock_s": tighter(m.max_shard_wall_clock_s, pspec.max_shard_wall_clock_s),
                "manifest_hash": mhash, "created_at": now_iso(), "budget_usd": m.budget_usd, "spot": m.spot,
                "price_key": pspec.price_key, "estimate_node_seconds_per_shard": m.estimate.node_seconds_per_shard,
                "ranks": m.resources.ranks, "max_concurrency": m.max_concurrency,
                "shards_done": 0, "shards_failed": 0, "spent_usd": 0.0,
                "code_version": self.settings.code_version}

    def open_read(self, job: dict) -> tuple[IngestLease, bool] | None:
        """An instrument drop's job row and lease, before its read (a multi-GB read shows at once, and a second
        delivery meanwhile steps back): created, or an earlier delivery's lapsed one taken over. Returns the
        lease and whether this ingest created the row (no shard of it can exist then); None when the job has
        moved on. Raises IngestLeased while another ingest holds it. ``accept`` merges the rest of the job
        into the row (its shard count, its resources) before any shard row or work item."""
        lease = IngestLease(self.ledger, job["job_id"], self.settings.ingest_lease_s)
        created = self._hold(job, lease)
        return None if created is None else (lease, created)

    def accept(self, job: dict, shards: Sized, spec, resources, bound, history: Future | None = None,
               select: tuple[str, ...] = (), opened: tuple[IngestLease, bool] | None = None) -> int:
        """Check, record and enqueue the job's ``shards`` (a sized, re-iterable sequence of ``(shard id,
        params, input blob, sha256[, byte range])``: a list, or a grid made lazily, ``upwell.ingest.fanout``);
        returns how many the job has. ``history``: the node time learned from earlier results, already asked
        for. ``select``: the artifact globs staged with a folder input (a reduce's, upwell.after.reduce).

        The job row is written first (status "ingesting", with ``shards_total``), so progress shows at once;
        then every point and work item is checked and the job priced, before any shard row or message.
        ``opened``: the row and lease ``open_read`` made before the drop was read."""
        job_id, total = job["job_id"], len(shards)
        if not total:
            raise InputRejected("the job has no shards", field="grid")
        if total > self.settings.max_shards:
            raise InputRejected(f"the job has {total} shards; the limit is {self.settings.max_shards}",
                                field="shard", limit=f"max_shards={self.settings.max_shards}")
        from upwell import shape
        from upwell.ingest import poolfit

        poolfit.check(shape.Shape(resources.nodes, resources.ranks, resources.oversubscribe), self.settings.pools,
                      job["pool"])
        job.update(ranks=resources.ranks, nodes=resources.nodes, gpus=resources.gpus, shards_total=total)
        _blocks(job, shards)
        make = _Items(job, spec, resources, self.settings.max_message_bytes, select)
        lease = opened[0] if opened else IngestLease(self.ledger, job_id, self.settings.ingest_lease_s)
        try:
            started = self._open(job, lease, fresh=opened[1] if opened else None)
            if started is None:
                bound.info("ingest.moved_on", detail="the job left ingesting while this delivery checked it")
                return total
            est_usd = self._priced(job, make.checked(shards), resources,
                                   history.result() if history is not None else None)
            queued_at, etags, targets = self._write_rows(job, shards, lease)
            todo = ((i, make.text(shard, etags[i] if i < len(etags) else "", queued_at))
                    for i, shard in _unsent(shards, started, lease))
            sent = self._enqueue(names.work_queue(job["pool"]), todo, lease)
            lease.finish(accepted_at=now_iso(), counter_targets=targets, **{k: job[k] for k in ESTIMATE})
        except Exception:
            lease.release()
            raise
        bound.info("ingest.accepted", shards=total, sent=sent, pool=job["pool"], payload=spec.ref,
                   estimate_usd=round(est_usd, 4))
        return total

    def history(self, job: dict):
        """Node time learned from earlier results of the job's payload on its pool (upwell.cost.forecast)."""
        from upwell.cost import forecast as est

        return est.learn(self.ledger, job["payload"], job["pool"])

    def _priced(self, job: dict, points: Iterable[dict], resources, history) -> float:
        """Put the estimate on ``job`` and check it against the budgets and the job's own; the USD."""
        est = self._estimate(job, points, resources, history)
        est_ns, est_usd = est.node_seconds, est.usd
        job.update(estimate_node_seconds=est_ns, estimate_usd=est_usd, node_share=est.share,
                   estimate_spot_fraction=est.spot_fraction,
                   estimate_basis=est.basis + (f"; range ${est.usd_low:.4f}-${est.usd_high:.4f}"
                                               if est.usd_high > est.usd_low else ""))
        from upwell.cost.budgets import check_budgets

        check_budgets(self.ledger, self.settings, owner=job["owner"], project=job["project"], estimate_usd=est_usd)
        if job["budget_usd"] is not None and est_usd > job["budget_usd"]:
            raise InputRejected(f"estimated cost ${est_usd:.2f} ({est_ns:.0f} node-seconds on {job['price_key']}) "
                                f"exceeds the budget ${job['budget_usd']:.2f}", field="budget_usd",
                                limit=f"budget_usd={job['budget_usd']}")
        return est_usd

    def _estimate(self, job: dict, points: Iterable[dict], resources, history=None):
        """Priced on the pool that runs it, node time learned from earlier results (``history``)."""
        from upwell.cost import forecast as est

        per_point = job["estimate_node_seconds_per_shard"] / max(1, int(job.get("points_per_item") or 1))
        return est.for_job(self.ledger, payload=job["payload"], pool=job["pool"], spec=self.settings.pools[job["pool"]],
                           points=points, manifest_s=per_point, spot=bool(job["spot"]),
                           resources=resources, history=history)

    def _open(self, job: dict, lease: IngestLease, fresh: bool | None = None) -> set[str] | None:
        """The job row: created with the lease, or the earlier one taken over and brought up to date. The
        shards an agent has already taken (a re-drive sends them no message); None: the job has moved on.
        ``fresh``: the row exists already, held by ``lease`` (``open_read``), True when this ingest made it."""
        if fresh is None:
            fresh = self._hold(job, lease)
        elif not self._merge(job, lease):  # open_read's row: the shard count and resources known since
            fresh = None
        if fresh is None:
            return None
        return set() if fresh else {r.shard_id for r in self.ledger.shards(job["job_id"])
                                    if r.status != ShardState.QUEUED}

    def _hold(self, job: dict, lease: IngestLease) -> bool | None:
        """The job row created with ``lease`` (True), or an earlier one taken over with the job merged in
        (False); None when the job has moved on."""
        _, created = self.ledger.create_job(JobRow.from_entity({**job, **lease.fields()}))
        if created:
            return True
        return False if self._merge(job, lease) else None

    @staticmethod
    def _merge(job: dict, lease: IngestLease) -> bool:
        """Take (or keep) ``lease`` on the job row, merging ``job`` into it but for what a re-drive never
        moves (KEPT); False when the job has moved on."""
        return lease.take({**{k: v for k, v in job.items() if k not in KEPT}, "message": ""}) is not None

    def _write_rows(self, job: dict, shards: Iterable[tuple], lease: IngestLease) -> tuple[str, list[str], str]:
        """One queued row per shard, ROWS_PER_BEAT at a time (rows that exist are left alone), renewing the
        lease between them. Returns the rows' ``queued_at``, each shard's row ETag as written here, in
        shard order and compact (upwell.messages ``compact_etag``: about 80 bytes a shard held until its
        work item goes; "" for a row that existed (a re-drive), whose work item then carries none), and the
        job's counter targets (``counters.tally`` of every shard id, existing rows' included)."""
        job_id, now = job["job_id"], now_iso()
        counts = [0] * counters.SHARDS
        rows = (ShardRow(job_id=job_id, shard_id=sid, status=ShardState.QUEUED, queued_at=now, pool=job["pool"],
                         params=json.dumps(params, sort_keys=True), input_blob=blob or "", input_sha256=digest,
                         input_range=json.dumps(_range(shard), sort_keys=True) if _range(shard) else "",
                         result_blob=f"{names.RESULTS}/{job_id}/{sid}.json",
                         points=blocks.points_json(_points(shard)) if _points(shard) else "")
                for shard in shards for sid, params, blob, digest, *_ in [shard])
        etags: list[str] = []
        while chunk := list(itertools.islice(rows, ROWS_PER_BEAT)):
            # one transaction at a time: Azurite reset concurrent ones
            etags += [compact_etag(e) for e in self.ledger.add_shards(job_id, chunk)]
            counts = counters.tally((row.shard_id for row in chunk), counts)
            lease.renew(0)
        return now, etags, ",".join(map(str, counts))

    def _enqueue(self, queue: str, todo: Iterable[tuple[int, str]], lease: IngestLease) -> int:
        """Send each ``(i, text)`` of ``todo``, renewing the lease as they go out in order; how many went."""
        def send(i: int, text: str) -> None:
            if SEND_HOOK is not None:
                SEND_HOOK(i)
            self.storage.send(queue, text)

        return send_in_order(todo, send, lease.renew, workers=self.settings.enqueue_workers,
                             per_s=self.settings.enqueue_per_s)


class _Items:
    """The job's work items, one per shard, made from the job row's fields as they are needed."""

    def __init__(self, job: dict, spec, resources, limit: int, select: tuple[str, ...] = ()):
        self.job, self.spec, self.resources, self.limit, self.select = job, spec, resources, limit, list(select)

    def text(self, shard: tuple, row_etag: str = "", queued_at: str = "") -> str:
        """The encoded work item of ``shard``; InputRejected past the message limit. ``row_etag``, ``queued_at``:
        its shard row as this ingest wrote it (compact ETag), carried where they fit under the limit: without
        them the agent reads the row, as for any other delivery (workers.delivery)."""
        sid, params, blob, *_ = shard
        job_id, d, r = self.job["job_id"], self.spec.definition, self.resources
        item = WorkItem(job_id=job_id, shard_id=sid, payload=d.name, pool=self.job["pool"], params=params,
                        payload_version=d.version, payload_sha256=self.spec.sha256, input_blob=blob,
                        checkpoint_prefix=f"{names.CHECKPOINTS}/{job_id}/{sid}/",
                        result_prefix=f"{names.RESULTS}/{job_id}/{sid}", ranks=r.ranks, gpus=r.gpus, nodes=r.nodes,
                        oversubscribe=r.oversubscribe, project=self.job["project"], input_select=self.select,
                        input_range=_range(shard), points=_points(shard) or [])
        if row_etag:
            try:
                return encode(dataclasses.replace(item, row_etag=expand_etag(row_etag), queued_at=queued_at),
                              self.limit)
            except InputRejected:
                pass  # no room for the row's ETag: the item goes without it
        try:
            return encode(item, self.limit)
        except InputRejected as exc:
            if not item.points:
                raise
            size = len(encode(item, 1 << 62).encode())
            raise blocks.too_large(sid, exc.message, blocks.fitting_message(item.points, size, self.limit),
                                   limit=exc.limit) from None

    def checked(self, shards: Iterable[tuple]) -> Iterator[dict]:
        """Each point's params (a block's, one by one), once its shard's work item is known to fit (size errors
        before any effect)."""
        for shard in shards:
            self.text(shard)
            yield from ({**shard[1], **p} for p in _points(shard)) if _points(shard) else (shard[1],)


def _unsent(shards: Iterable[tuple], started: set[str], lease: IngestLease) -> Iterator[tuple[int, tuple]]:
    """``(i, shard)`` for each shard still to send: sent already are every item before the lease's mark,
    and any whose shard an agent has taken since."""
    for i, shard in enumerate(shards):
        if i >= lease.sent and shard[0] not in started:
            yield i, shard


def _points(shard: tuple) -> list[dict] | None:
    """A block's points, each point's own values over the shard's params (upwell.ingest.blocks)."""
    return shard[5] if len(shard) > 5 else None


def _blocks(job: dict, shards) -> None:
    """A job of blocks records its points and k, and its estimate per shard becomes one block's (the scaler
    reads a work item's run time from it); a job of one point per shard records nothing new."""
    k = int(getattr(shards, "k", 1) or 1)
    if k > 1:
        job.update(points_total=int(shards.points), points_per_item=k,
                   estimate_node_seconds_per_shard=job["estimate_node_seconds_per_shard"] * k)


def _uploader(props) -> str:
    """Who uploaded, where the upload says: blob metadata ``uploaded_by`` (upwell submit sets it)."""
    meta = getattr(props, "metadata", None) or {}
    return str(meta.get("uploaded_by") or meta.get("upwell_owner") or "")[:200]


def _range(shard: tuple) -> dict | None:
    """A shard's byte range of its input at a pinned version (upwell.shardref), when it references one."""
    return shard[4] if len(shard) > 4 else None
