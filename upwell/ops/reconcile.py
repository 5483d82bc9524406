"""The reconciler: finds work that an event never started, and re-drives it through the same idempotent paths.

On Azure a blob trigger is Event Grid-sourced: an event that never came (a blob written before the
subscription existed, a dropped delivery), an event that was dead-lettered (a 401 after a key rotation,
24 h of failures) or a blob-trigger message that was poisoned (five failures in a row) leaves its job
unfinished, because nothing else reads those places. One pass finds:

* ``incoming/`` blobs older than the grace period with neither a job row nor a quarantine record (a
  rejected job row), and jobs stuck in ``ingesting``: those whose ingest's lease has lapsed
  (``upwell.ingest.lease``). An ingest that still renews its lease is left alone, however long it runs;
* result blobs of active jobs whose shard row is not terminal, and such jobs whose every shard is counted
  but that no finisher ended (``upwell.jobcounts``): each is ended once, and its report asked for;
* terminal jobs without a report (the report message is sent again);
* ended jobs whose after-job step a crash left half done: an analysis claimed with no reduce job, an
  event claimed and never queued (``upwell.after.recover``), read through the index of recently ended
  jobs;
* events in the Event Grid dead-letter container and messages in
  ``webjobs-blobtrigger-poison``.

Each is re-driven through ``Ingestor.ingest`` or ``collect``, which are idempotent (a second delivery is a
no-op). An input whose re-drive keeps failing is quarantined with ``RedriveExhausted`` after
``max_redrives`` tries; nothing is dropped.

Cost is bounded. ``incoming/`` is found one of two ways (``UPWELL_RECONCILE_SOURCE``):

* ``listing`` (the default, and the only one Azurite has): each pass lists ``incoming/``, but a watermark
  of last-modified times (the reconciler's state row in the scaling log, ``upwell.scalelog``) means only
  newer blobs are checked, each by a point read of the job row its name and ETag derive: O(new) checked;
* ``changefeed``: the account's blob change feed (``upwell.ops.changefeed``) is read from a cursor (a
  segment and, per chunk, an Avro block offset) kept in the same row: O(new events). The first pass, and a
  pass on an account without a feed, lists as above.

Results are listed for active jobs only; at most ``max_actions`` re-drives run per pass, and the watermark
or cursor stops before the first upload left for the next pass. Every action is logged and written to the
scaling log, where ``upwell status`` reads it. ``dry_run`` finds and logs, and changes nothing.

No pass queries the `jobs` table without a PartitionKey (issue 24, item 4): active jobs come through the
open-jobs index, the report and after-job checks through one read of the ended-jobs index since the last pass,
an upload's job by a point read. An open job without its index entry cannot happen by the order of writes
(upwell.jobindex); an ended job whose ended entry a crash left out keeps its open entry, which this pass's open
read mends first. The first pass after an upgrade catalogues and indexes older jobs (``catalog``: the one scan,
run once, recorded in the state row). A pass that found nothing (``Pass.seen``) writes nothing.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from azure.core.exceptions import ResourceNotFoundError

from upwell import logs, names
from upwell.access.tags import folder_project
from upwell.after import recover
from upwell.counters import complete
from upwell.errors import NotFound, RedriveExhausted
from upwell.ingest import lease
from upwell.ingest.blobnames import is_manifest, is_manifest_input, job_id_for
from upwell.ingest.ingestor import Ingestor
from upwell.ingest.quarantine import quarantine
from upwell.ledger import TERMINAL_JOB, TERMINAL_SHARD, JobRow, JobState, Ledger
from upwell.ops.changefeed import BLOB_CREATED, ChangeFeed, Cursor, Record
from upwell.ops.changefeed import CONTAINER as CHANGEFEED
from upwell.ops.eventblobs import event_blobs, poison_text
from upwell.results.collect import RESULT_NAME, close_counted, collect
from upwell.results.publish import reconcile as requeue_reports
from upwell.scalelog import Action, ScalingLog
from upwell.settings import Settings
from upwell.storage import Storage

log = logs.get("upwell.ops.reconcile")
ACTIVE_JOB = (JobState.ACCEPTED, JobState.RUNNING)  # jobs whose shards may still be collected
POISON_LEASE_S = 120
REPORT_MARGIN_S = 3600.0  # the report check looks back this far before the last pass
AFTER_FIRST_S = 86400.0  # the first after-job check looks back this far (later ones: since the last pass)
CATALOG = 1  # the job catalogue's backfill (upwell.jobcatalog) recorded in the state row: it runs once
STEPS = ("catalog", "dead_letters", "poison", "incoming", "results", "reports", "after")  # one pass, in this order


@dataclass
class Pass:
    """What one pass saw and did."""

    listed: int = 0
    checked: int = 0
    events: int = 0  # change feed records read (changefeed mode)
    seen: int = 0  # things the pass found to look at: new uploads, open jobs, changed or ended rows, dead letters
    actions: list[Action] = field(default_factory=list)
    watermark: float = 0.0
    cursor: str = ""  # the change feed segment the next pass starts at (changefeed mode)
    seconds: float = 0.0

    def count(self, kind: str) -> int:
        return sum(1 for a in self.actions if a.kind == kind)


def _ts(value: dt.datetime | None) -> float:
    return value.timestamp() if value else 0.0


class Reconciler:
    """One pass at a time over storage. State: the watermark row and the action log in the scaling log."""

    def __init__(self, storage: Storage, settings: Settings, ledger: Ledger | None = None, *,
                 dry_run: bool = False, clock: Callable[[], float] = time.time) -> None:
        self.storage, self.settings, self.dry_run, self.clock = storage, settings, dry_run, clock
        self.ledger = ledger or Ledger(storage)
        self.log = ScalingLog(storage)
        self.budget = settings.reconcile_max_actions

    # -- state and the action log --------------------------------------------------------------

    def state(self) -> dict:
        return self.log.reconcile_state()

    def _save(self, state: dict) -> None:
        if not self.dry_run:
            self.log.save_reconcile_state(state)

    def _act(self, result: Pass, action: Action) -> None:
        result.actions.append(action)
        (log.warning if action.outcome in ("failed", "quarantined") else log.info)(
            "reconcile.action", **{k: v for k, v in asdict(action).items() if k != "at"})
        self.log.record_action(action)

    # -- one pass ------------------------------------------------------------------------------

    def run(self, steps: tuple[str, ...] = STEPS) -> Pass:
        """One pass over every place a lost event leaves a trace (``steps``: a part of it, as the bench times
        the incoming/ step alone). Raises only when storage is down."""
        started, state, result = time.monotonic(), self.state(), Pass()
        self._memo: dict[str, list[JobRow]] = {}  # reads the steps of this pass share
        before = json.loads(json.dumps(state))
        redrives = state.setdefault("redrives", {})
        for step in (getattr(self, f"_{name}") for name in steps):
            try:
                step(result, state, redrives)
            except Exception as exc:  # noqa: BLE001 - one failing step never stops the others
                log.warning("reconcile.step_failed", step=step.__name__.strip("_"), error=str(exc)[:300])
        if result.seen or _moved(before, state):
            self._save(state)  # an idle pass moves only its time marks: they stay, and nothing is written
        result.watermark, result.seconds = state["watermark"], round(time.monotonic() - started, 3)
        log.info("reconcile.pass", listed=result.listed, checked=result.checked, events=result.events,
                 actions=len(result.actions), watermark=result.watermark, cursor=result.cursor,
                 seconds=result.seconds, dry_run=self.dry_run)
        return result

    def _spend(self) -> bool:
        if self.budget <= 0:
            return False
        self.budget -= 1
        return True

    # -- incoming/ -------------------------------------------------------------------------------

    def _catalog(self, result: Pass, state: dict, redrives: dict) -> None:
        """The first pass after an upgrade: every job row into the job catalogue and the index (the one
        scan of `jobs`); its rows serve this pass's report check. Then never again (the state row)."""
        if self.dry_run or state.get("catalog") == CATALOG:
            return
        rows = self.ledger.backfill_catalog()
        self._memo["backfilled"] = [j for j in rows if j.status in TERMINAL_JOB and not j.reported]
        state["catalog"] = CATALOG
        log.info("reconcile.catalog_backfilled", jobs=len(rows))

    def _known(self, uploads: list[tuple[str, str]]) -> dict[str, JobRow | None]:
        """job id -> job row (None: none yet) of each upload (name, ETag: its job id derives from both):
        point reads, 16 at once; never a query of the `jobs` table."""
        ids = sorted({job_id_for(name, etag) for name, etag in uploads})
        if len(ids) < 2:
            return {i: self.ledger.job(i) for i in ids}
        with ThreadPoolExecutor(16, thread_name_prefix="reconcile-read") as pool:
            return dict(zip(ids, pool.map(self.ledger.job, ids), strict=True))

    def _needs(self, job: JobRow | None, target: str) -> str:
        """What an upload whose job row is ``job`` needs: "missed_upload" (no row), "stuck_ingest" (its
        ingest's lease has lapsed), "live_ingest" (an ingest renews it: look again next pass) or ""."""
        if job is None:
            return "missed_upload"
        if job.status != JobState.INGESTING:
            return ""
        if lease.live(job, self.clock(), self.settings.ingest_lease_s):
            log.info("reconcile.live_ingest", target=target, job_id=job.job_id,
                     beat_s=round(self.clock() - job.ingest_beat_at, 1))
            return "live_ingest"
        return "stuck_ingest"

    def _incoming(self, result: Pass, state: dict, redrives: dict) -> None:
        if self.settings.reconcile_source == "changefeed":
            self._incoming_changefeed(result, state, redrives)
        else:
            self._incoming_listing(result, state, redrives)

    def _incoming_listing(self, result: Pass, state: dict, redrives: dict) -> None:
        watermark, cutoff = float(state.get("watermark") or 0.0), self.clock() - self.settings.reconcile_grace_s
        candidates = []
        for blob in self.storage.list(names.INCOMING):
            result.listed += 1
            modified = _ts(blob.last_modified)
            if modified <= watermark:
                continue
            if is_manifest_input(blob.name) and not is_manifest(blob.name):
                continue  # a manifest's data: never a job of its own
            etag = str(blob.etag)  # listings drop the quotes that properties (and so job ids) keep
            candidates.append((modified, blob.name, etag if etag.startswith('"') else f'"{etag}"'))
        candidates.sort()
        result.seen += len(candidates)
        known = self._known([(name, etag) for modified, name, etag in candidates if modified <= cutoff])
        # Listings give last-modified to the second: a blob written just after the cutoff can list at or
        # below it, so the mark stays a second behind (those blobs are looked at again, and found known).
        new_mark = cutoff - 1.0
        for modified, name, etag in candidates:
            if modified > cutoff:
                new_mark = min(new_mark, modified)  # too young: an event may still be on its way
                break
            result.checked += 1
            kind = self._needs(known.get(job_id_for(name, etag)), name)
            if not kind:
                continue
            if kind == "live_ingest" or not self._redrive_ingest(result, redrives, kind, name, etag):
                new_mark = min(new_mark, modified - 1e-3)  # not resolved: the next pass looks again
        if not self.dry_run:
            state["watermark"] = max(watermark, new_mark)

    def _incoming_changefeed(self, result: Pass, state: dict, redrives: dict) -> None:
        """incoming/ uploads found in the change feed from the cursor on. The first pass lists incoming/
        (every upload before the feed is read) and starts the cursor an hour before its watermark; an
        account without a feed (Azurite) is listed every pass, so nothing is missed."""
        feed = ChangeFeed(self.storage.container(CHANGEFEED))
        if not feed.enabled():
            log.warning("reconcile.changefeed_missing", detail=f"no {CHANGEFEED} container: listing incoming/")
            self._incoming_listing(result, state, redrives)
            return
        if not state.get("changefeed"):
            self._incoming_listing(result, state, redrives)
            if not self.dry_run:
                state["changefeed"] = Cursor.starting(dt.datetime.fromtimestamp(state["watermark"], dt.UTC)).to_dict()
            result.cursor = (state.get("changefeed") or {}).get("segment", "")
            return
        cursor = Cursor.from_dict(state["changefeed"])
        until = feed.last_consumable()
        for key in feed.segment_keys(cursor.segment, until) if until else []:
            if not self._segment(result, redrives, feed, key, cursor):
                break  # an upload is left for the next pass: later segments wait with it
        result.cursor = cursor.segment
        if not self.dry_run:
            state["changefeed"] = cursor.to_dict()

    def _segment(self, result: Pass, redrives: dict, feed: ChangeFeed, key: str, cursor: Cursor) -> bool:
        """Check the uploads among one segment's new records; move ``cursor`` to this segment, each chunk
        past every record resolved. False when one is left for the next pass."""
        start = cursor.chunks if key == cursor.segment else {}
        ends: dict[str, list[int]] = {}
        candidates: list[Record] = []
        for shard in feed.segment(key).shards:
            for chunk, size in feed.chunks(shard):
                records, ends[chunk] = feed.records(chunk, size, start.get(chunk))
                result.events += len(records)
                result.seen += len(records)
                candidates += [r for r in records if _is_upload(r)]
        cutoff, resume = self.clock() - self.settings.reconcile_grace_s, dict(ends)
        known = self._known([(r.name, r.etag) for r in candidates if not r.time or r.time.timestamp() <= cutoff])
        for record in candidates:
            if not self._resolve(result, redrives, record, known, cutoff):
                here = [*record.position, ends[record.chunk][2]]
                resume[record.chunk] = min(resume[record.chunk], here)
        cursor.segment, cursor.chunks = key, resume
        return resume == ends

    def _resolve(self, result: Pass, redrives: dict, record: Record, known: dict[str, JobRow | None],
                 cutoff: float) -> bool:
        """True once the upload a BlobCreated record names has its job (or needs none)."""
        if record.time and record.time.timestamp() > cutoff:
            return False  # too young: its event may still be on its way
        result.checked += 1
        kind = self._needs(known.get(job_id_for(record.name, record.etag)), record.name)
        if kind in ("", "live_ingest"):
            return not kind  # a live ingest: left for the next pass
        try:
            etag = str(self.storage.blob(names.INCOMING, record.name).get_blob_properties().etag)
        except (ResourceNotFoundError, NotFound):
            return True  # moved (a quarantined upload has its job row) or deleted since
        if etag != record.etag:
            return True  # overwritten since: the newer upload has its own record further on
        return self._redrive_ingest(result, redrives, kind, record.name, etag)

    def _redrive_ingest(self, result: Pass, redrives: dict, kind: str, name: str, etag: str) -> bool:
        """Ingest ``incoming/<name>`` again; quarantine it once it has failed ``max_redrives`` times."""
        target = f"{names.INCOMING}/{name}"
        if self.dry_run:
            self._act(result, Action(kind, target, "would_redrive", dry_run=True))
            return True
        if not self._spend():
            return False
        key = f"{name}\n{etag}"
        ingestor = Ingestor(self.storage, self.settings, self.ledger)
        try:
            outcome = ingestor.ingest(name)
        except Exception as exc:  # noqa: BLE001 - counted; quarantined once it keeps failing
            tries = int(redrives.get(key, 0)) + 1
            redrives[key] = tries
            error = f"{type(exc).__name__}: {str(exc)[:300]}"
            if tries < self.settings.reconcile_max_redrives:
                self._act(result, Action(kind, target, "failed", f"try {tries}: {error}"))
                return False
            self._quarantine(name, etag, tries, error)
            redrives.pop(key, None)
            self._act(result, Action(kind, target, "quarantined", f"RedriveExhausted after {tries} tries: {error}"))
            return True
        redrives.pop(key, None)
        self._act(result, Action(kind, target, "redriven", f"{outcome.status} {outcome.job_id}".strip()))
        return True

    def _quarantine(self, name: str, etag: str, tries: int, error: str) -> None:
        exc = RedriveExhausted(f"incoming/{name[:200]} failed {tries} re-drives by the reconciler; last error: "
                               f"{error}", field="redrive", limit=f"max_redrives={tries}", source=f"incoming/{name}")
        quarantine(self.storage.for_project(folder_project(name) or self.settings.project), self.ledger,
                   job_id_for(name, etag), name, etag, exc)

    # -- results/ ----------------------------------------------------------------------------------

    def _results(self, result: Pass, state: dict, redrives: dict) -> None:
        cutoff = self.clock() - self.settings.reconcile_grace_s
        active = [j for j in self._open() if j.status in ACTIVE_JOB]
        result.seen += len(active)
        for job in active:
            job_id = job.job_id
            if complete(job):  # every shard counted, and no finisher saw it (upwell.jobcounts): end it once
                status = "" if self.dry_run else close_counted(self.storage, self.ledger, job_id)
                if self.dry_run or status:
                    self._act(result, Action("unclosed_job", job_id, "closed" if status else "would_redrive", status,
                                             dry_run=self.dry_run))
                continue
            open_shards = {r.shard_id for r in self.ledger.shards(job_id) if r.status not in TERMINAL_SHARD}
            if not open_shards:
                continue
            for blob in self.storage.list(names.RESULTS, f"{job_id}/"):
                result.listed += 1
                m = RESULT_NAME.match(blob.name)
                if not m or m["shard"] not in open_shards or _ts(blob.last_modified) > cutoff:
                    continue
                result.checked += 1
                self._redrive_collect(result, "uncollected_result", blob.name)

    def _redrive_collect(self, result: Pass, kind: str, name: str) -> bool:
        target = f"{names.RESULTS}/{name}"
        if self.dry_run:
            self._act(result, Action(kind, target, "would_redrive", dry_run=True))
            return True
        if not self._spend():
            return False
        try:
            done = collect(self.storage, name, self.ledger)
        except Exception as exc:  # noqa: BLE001 - a transient error: the next pass tries again
            self._act(result, Action(kind, target, "failed", f"{type(exc).__name__}: {str(exc)[:300]}"))
            return False
        detail = "" if done is None else f"counted={done.counted} job_done={done.job_done}"
        self._act(result, Action(kind, target, "redriven", detail))
        return True

    # -- reports -------------------------------------------------------------------------------------

    def _open(self) -> list[JobRow]:
        """The open jobs, through the index, once per pass; the read moves an open entry of an ended job
        (a crash before its ended entry) to ended, where ``_ended`` finds it."""
        if "open" not in self._memo:
            self._memo["open"] = self.ledger.open_jobs()
        return self._memo["open"]

    def _ended(self, state: dict) -> list[JobRow]:
        """The jobs that ended since the earlier of the report and after-job checks' last passes (less an
        hour; a first pass looks back a day): one read of the ended-jobs index, after the open one."""
        if "ended" not in self._memo:
            self._open()
            now = self.clock()
            within = max(now - float(state[k]) + REPORT_MARGIN_S if state.get(k) else AFTER_FIRST_S
                         for k in ("last_pass", "after_pass"))
            self._memo["ended"] = self.ledger.ended_jobs(within)
        return self._memo["ended"]

    def _reports(self, result: Pass, state: dict, redrives: dict) -> None:
        """Terminal jobs without a report among those that ended since the last pass (``_ended``), and on
        the first pass after an upgrade among every job row (``_catalog``). A job is indexed as ended after
        its row is written, and an open entry of an ended job is moved to ended by the open read, so none is
        missed."""
        if self.dry_run:
            return
        now, last = self.clock(), float(state.get("last_pass") or 0.0)
        stale = min(60.0, float(self.settings.reconcile_grace_s))
        rows = {j.job_id: j for j in [*self._ended(state), *self._memo.get("backfilled", [])]}
        result.seen += len(rows)
        pending = [j for j in rows.values() if not j.reported]
        for job_id in requeue_reports(self.storage, self.ledger, stale_s=stale, jobs=pending):
            self._act(result, Action("unreported_job", job_id, "requeued"))
        waiting = [j for j in pending if j.status in TERMINAL_JOB and j.status != JobState.REJECTED]
        # A job still waiting for its report keeps the window where it was until it is reported.
        state["last_pass"] = last if waiting else now

    # -- after the job: a reduce or an event a crash left half started ------------------------------------

    def _after(self, result: Pass, state: dict, redrives: dict) -> None:
        """Jobs that ended since the last such pass (less an hour; the first pass looks back a day), through
        the ended-jobs index, whose reduce or notification a crash left claimed and not started. A trace
        younger than the grace keeps the window where it was until it is old enough to complete."""
        now, last = self.clock(), float(state.get("after_pass") or 0.0)
        young = False
        ended = self._ended(state)
        result.seen += len(ended)
        for job in ended:
            for trace in recover.find(self.ledger, self.settings, job, now):
                young = young or trace.young
                if trace.young:
                    continue
                if self.dry_run:
                    self._act(result, Action(trace.kind, job.job_id, "would_redrive", trace.detail, dry_run=True))
                elif self._spend():
                    detail = recover.complete(self.storage, self.settings, self.ledger, trace)
                    self._act(result, Action(trace.kind, job.job_id, "redriven", detail))
                else:
                    young = True  # out of re-drives this pass: the next one looks again
        if not self.dry_run:
            state["after_pass"] = last if young else now

    # -- Event Grid dead letters and poisoned blob-trigger messages ------------------------------------

    def _redrive_blob(self, result: Pass, redrives: dict, kind: str, container: str, name: str) -> bool:
        if container == names.INCOMING:
            try:
                etag = str(self.storage.blob(names.INCOMING, name).get_blob_properties().etag)
            except (ResourceNotFoundError, NotFound):
                self._act(result, Action(kind, f"{container}/{name}", "skipped", "the blob is gone (moved or deleted)"))
                return True
            return self._redrive_ingest(result, redrives, kind, name, etag)
        if container == names.RESULTS:
            return self._redrive_collect(result, kind, name)
        self._act(result, Action(kind, f"{container}/{name}", "skipped", "no function of upwell watches it"))
        return True

    def _dead_letters(self, result: Pass, state: dict, redrives: dict) -> None:
        container = self.storage.container(names.EVENTGRID_DEADLETTER)
        try:
            blobs = list(container.list_blobs())
        except ResourceNotFoundError:
            return
        result.seen += len(blobs)
        for blob in blobs:
            result.listed += 1
            client = container.get_blob_client(blob.name)
            try:
                events = json.loads(client.download_blob().readall())
            except (ValueError, ResourceNotFoundError, NotFound):
                continue
            resolved = all(self._redrive_blob(result, redrives, "dead_letter", *where)
                           for where in event_blobs(events if isinstance(events, list) else [events]))
            if resolved and not self.dry_run:
                client.delete_blob()

    def _poison(self, result: Pass, state: dict, redrives: dict) -> None:
        queue = self.storage.queue(names.BLOB_POISON_QUEUE)
        try:
            messages = (list(queue.peek_messages(max_messages=32)) if self.dry_run else
                        list(queue.receive_messages(max_messages=32, visibility_timeout=POISON_LEASE_S)))
        except ResourceNotFoundError:
            return
        result.seen += len(messages)
        for message in messages:
            result.listed += 1
            try:
                body = json.loads(poison_text(message.content))
                where = (body["ContainerName"], body["BlobName"])
            except (ValueError, KeyError, TypeError):
                continue
            if self._redrive_blob(result, redrives, "poison", *where) and not self.dry_run:
                queue.delete_message(message.id, message.pop_receipt)


TIME_MARKS = ("watermark", "last_pass", "after_pass")  # what an idle pass moves, and only that


def _moved(before: dict, after: dict) -> bool:
    """Whether the pass changed the state beyond its time marks (re-drive counts, the change feed cursor)."""
    return ({k: v for k, v in before.items() if k not in TIME_MARKS}
            != {k: v for k, v in after.items() if k not in TIME_MARKS})


def _is_upload(record: Record) -> bool:
    """A BlobCreated record of an incoming/ blob that is a job of its own (not a manifest's data)."""
    if record.event_type != BLOB_CREATED or record.container != names.INCOMING or not record.name:
        return False
    return is_manifest(record.name) or not is_manifest_input(record.name)


def recent_actions(storage: Storage, limit: int = 20) -> list[dict]:
    """The reconciler's latest actions, newest first (for ``upwell status``)."""
    keys = ("at", "kind", "target", "outcome", "detail", "dry_run")
    return [{k: getattr(a, k) for k in keys} for a in ScalingLog(storage).actions(limit)]
