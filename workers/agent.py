"""The worker agent: the container entrypoint (`python -m workers.agent --pool cpu`).

Loop: receive work items with a visibility lease, stage each one's input and any
checkpoint, run the payload (extending the lease while it runs), stage out the
artifacts, conditionally create the result, then acknowledge. The agent keeps
no state beyond the messages in hand and short-lived copies of job rows
(workers.jobrows); the queue and the ledger hold the rest.

Slots: the agent runs up to ``slots`` work items at once (the pool's tasks per
node, UPWELL_SLOTS; default 1), each in its own thread around its own payload
process, with its own lease renewal. One receive asks for up to as many
messages as there are free slots; each is leased for ``lease_s`` from then.

Signals: SIGTERM/SIGINT (spot eviction, scale-in of a busy node) preempt every
running payload, which checkpoints; each message is made visible again at once
and a preemption, not a failure, is recorded. SIGUSR1 drains: finish the items
in hand, then exit. The agent also exits after ``idle_exit_s`` without work.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import unicodedata
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from upwell import logs, names
from upwell.cost import wallclock
from upwell.errors import DecodeError, UpwellError
from upwell.lease import Lease
from upwell.ledger import JobRow, JobState, Ledger, ShardRow
from upwell.messages import WorkItem, decode
from upwell.payloads.registry import Registry
from upwell.settings import Settings, env_bool, env_float, env_int
from upwell.storage import Storage
from upwell.timeutil import now_iso, seconds_between
from upwell.verdict import AttemptConfig, AttemptResult, Verdict, VerdictKind, decide_attempt, decide_delivery
from workers import results
from workers.cancel import CANCELLED, CancelWatch
from workers.jobrows import JobRows


@dataclass(frozen=True)
class AgentConfig:
    pool: str
    lease_s: int = 60  # visibility timeout, extended every lease_s / 3 while the payload runs
    idle_exit_s: float = 0.0  # 0: never exit for idleness
    poll_s: float = 1.0
    max_dequeue_count: int = 5  # real failures before poison (host.json maxDequeueCount)
    retry_backoff_s: float = 2.0  # a failed attempt waits backoff * 2^(attempt-1) s, at most 60
    defer_s: int = 2  # a shard whose job is at its concurrency cap waits this long (plus jitter)
    node_id: str = ""
    spot: bool = False
    vm_size: str = "local"
    state_file: str = ""  # where the local pool reads this worker's state
    scratch: str = ""
    max_items: int = 0  # 0: unlimited
    ranks: int = 0  # the allocation's ranks (a Slurm job's CPUs): an MPI payload runs with these; 0: the item's
    slots: int = 1  # work items run at once (the pool's tasks per node); 1: one after another
    job_row_ttl_s: float = 5.0  # a job row read this recently is reused (workers.jobrows); 0: read every delivery
    shared_machine: bool = False  # local nodes share this machine's CPUs: time spent waiting for one is not node time

    @classmethod
    def from_env(cls, pool: str, **overrides) -> AgentConfig:
        """From the node's environment; a bad value raises ConfigError naming the variable."""
        env = os.environ
        node = env.get("UPWELL_NODE_ID") or env.get("AZ_BATCH_NODE_ID") or f"{socket.gethostname()}-{os.getpid()}"
        kw = dict(pool=pool, node_id=node, spot=env_bool(env, "UPWELL_NODE_SPOT"),
                  vm_size=env.get("UPWELL_VM_SIZE", "local"), state_file=env.get("UPWELL_STATE_FILE", ""),
                  scratch=env.get("UPWELL_SCRATCH", ""),
                  max_dequeue_count=env_int(env, "UPWELL_MAX_DEQUEUE_COUNT", 5, minimum=1),
                  lease_s=env_int(env, "UPWELL_LEASE_S", 60, minimum=1),
                  retry_backoff_s=env_float(env, "UPWELL_RETRY_BACKOFF_S", 2.0, minimum=0),
                  poll_s=env_float(env, "UPWELL_POLL_S", 1.0, minimum=0.01),
                  ranks=env_int(env, "UPWELL_RANKS", 0, minimum=0),
                  slots=env_int(env, "UPWELL_SLOTS", 1, minimum=1),
                  job_row_ttl_s=env_float(env, "UPWELL_JOB_ROW_TTL_S", 5.0, minimum=0),
                  shared_machine=env_bool(env, "UPWELL_SHARED_MACHINE"))
        kw.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**kw)


@dataclass
class _Hand:
    """The message in hand: its work item, lease, rows, bound log, and when the attempt started.
    ``etag``: the shard row's ETag once this agent marked it running (collect's first try uses it)."""

    item: WorkItem
    lease: Lease
    shard: ShardRow
    job: JobRow
    log: Any
    started: str | None = None
    etag: str = ""
    staging_wait_s: float = 0.0  # this slot's thread waited for a CPU while it staged in (a shared machine's cost)

    def seen_row(self) -> dict[str, str] | None:
        """The shard row as this agent last left it, for the result document: status and ETag."""
        if self.etag:
            return {"status": "running", "etag": self.etag}
        if self.shard.etag:
            return {"status": self.shard.status.value, "etag": self.shard.etag}
        return None


class Agent:
    """Runs work items from one pool's queue until stopped, drained or idle."""

    def __init__(self, storage: Storage, config: AgentConfig, settings: Settings | None = None):
        self.storage = storage
        self.config = config
        self.settings = settings or Settings.from_env()
        self.ledger = Ledger(storage)
        self.jobs = JobRows(self.ledger.job, config.job_row_ttl_s)
        self.definitions = Registry(storage, self.settings.registry_allowlist)
        self.queue_name = names.work_queue(config.pool)
        self.poison_name = names.poison_queue(self.queue_name)
        self.queue = storage.queue(self.queue_name)
        self.attempts = AttemptConfig(max_failures=config.max_dequeue_count, retry_backoff_s=config.retry_backoff_s)
        self.stop = threading.Event()  # preempt now
        self.drain = threading.Event()  # finish the item in hand, then exit
        self.log = logs.get("upwell.agent", pool=config.pool, node=config.node_id)
        self.processed = 0
        self._lock = threading.Lock()  # processed, the running set and the state file
        self._running: dict[str, str] = {}  # message id -> job/shard, for the state file
        if config.scratch:  # a node whose scratch folder is missing must not fail (and poison) every shard
            Path(config.scratch).mkdir(parents=True, exist_ok=True)

    # -- the loop -------------------------------------------------------------------
    def run(self) -> int:
        """Receive and run work items until stopped, drained, idle for ``idle_exit_s`` or at ``max_items``.
        With one slot each item runs in this thread; with more, each in a slot thread of its own."""
        slots = max(1, self.config.slots)
        threads = ThreadPoolExecutor(slots, thread_name_prefix="upwell-slot") if slots > 1 else None
        inflight: set[Future] = set()
        idle_since = time.monotonic()
        self._state("idle")
        try:
            while not self.stop.is_set() and not self.drain.is_set():
                inflight = {f for f in inflight if not f.done()}
                want = self._wanted(slots, len(inflight))
                msgs = self._receive(want) if want > 0 else []
                if msgs:
                    for msg in msgs:
                        if threads is None:
                            self._one(msg)
                        else:
                            inflight.add(threads.submit(self._one, msg))
                    idle_since = time.monotonic()
                elif inflight:  # busy slots and nothing more to take: wait for one (or poll again)
                    wait(inflight, timeout=self.config.poll_s, return_when=FIRST_COMPLETED)
                    idle_since = time.monotonic()
                elif want <= 0:
                    break  # max_items reached
                elif msgs is not None and self._idle_out(idle_since):
                    break
        finally:
            if threads is not None:  # items in hand finish (drain) or checkpoint and go back (stop)
                threads.shutdown(wait=True)
        self._state("stopped")
        return 0

    def _idle_out(self, idle_since: float) -> bool:
        """Nothing to do: True when the agent has been idle past idle_exit_s, else wait one poll."""
        if self.config.idle_exit_s and time.monotonic() - idle_since > self.config.idle_exit_s:
            self.log.info("agent.idle_exit", processed=self.processed)
            return True
        self.stop.wait(self.config.poll_s)
        return False

    def _receive(self, want: int) -> list | None:
        """Up to ``want`` messages, each leased for lease_s; None after a failed receive (waited out)."""
        try:
            return self.storage.receive_many(self.queue_name, max_messages=want, visibility_timeout=self.config.lease_s)
        except UpwellError as exc:
            self.log.warning("agent.receive_failed", error=str(exc).splitlines()[0][:200], code=exc.code)
            self.stop.wait(self.config.poll_s * 2)
            return None

    def _wanted(self, slots: int, busy: int) -> int:
        """How many messages to ask for: the free slots, and no more than max_items leaves."""
        free = slots - busy
        if self.config.max_items:
            with self._lock:
                free = min(free, self.config.max_items - self.processed - busy)
        return free

    def _one(self, msg) -> None:
        """Handle one message in its slot; a crash is logged and the message reappears after its lease."""
        try:
            self.handle(msg)
        except Exception as exc:
            self.log.exception("agent.handle_crashed", error=str(exc)[:300])
        with self._lock:
            self.processed += 1
            self._state_locked()

    def handle(self, msg) -> str:
        """Process one message; returns what happened (for tests and logs)."""
        lease = Lease(self.queue, msg, self.config.lease_s, min_renew_s=self.config.lease_s / 3)
        try:
            item = decode(msg.content)
        except DecodeError as exc:
            verdict = decide_delivery(decoded=False, result_exists=False, dequeue_count=msg.dequeue_count,
                                      shard=ShardRow(), job=JobRow(), config=self.attempts)
            self.storage.send(self.poison_name, msg.content)
            lease.delete()
            self.log.error("agent.undecodable", error=str(exc), message_id=msg.id, reason=verdict.reason)
            return "poisoned-undecodable"
        log = self.log.bind(job_id=item.job_id, shard_id=item.shard_id)
        hand = _Hand(item, lease, ShardRow(job_id=item.job_id, shard_id=item.shard_id), JobRow(job_id=item.job_id),
                     log)
        exists = self.storage.exists(f"{names.RESULTS}/{item.result_blob}")
        if not exists:
            hand.shard = self.ledger.shard(item.job_id, item.shard_id) or hand.shard
            hand.job = self.jobs.get(item.job_id, shard=hand.shard) or hand.job
        verdict = decide_delivery(decoded=True, result_exists=exists, dequeue_count=msg.dequeue_count,
                                  shard=hand.shard, job=hand.job, config=self.attempts)
        if verdict.kind is VerdictKind.DONE:
            lease.delete()
            log.info("agent.duplicate", dequeue_count=msg.dequeue_count)
            return "duplicate"
        if verdict.kind is not VerdictKind.RUN:
            return self._give_up(hand, verdict)
        if hand.job.status == CANCELLED:  # upwell cancel: a leftover message of a cancelled job
            return self._cancelled(hand)
        overdue = wallclock.job_overdue(hand.job)  # the job's kill switch (upwell.cost.wallclock)
        if overdue:
            return self._give_up(hand, Verdict(VerdictKind.DROP, reason=overdue))
        cap = self._cap(hand.job)
        if cap and self._over_cap(item, cap, started=False):
            return self._defer(hand, cap, started=False)
        attempt = msg.dequeue_count
        if not self._mark_started(hand, attempt):
            lease.delete()
            return "duplicate"
        if cap and self._over_cap(item, cap, started=True):  # lost a race for the last slot
            return self._defer(hand, cap, started=True)
        hand.item = item.with_attempt(attempt)
        with self._in_hand(msg.id, f"{item.job_id}/{item.shard_id}"):
            return self._run(hand)

    @contextmanager
    def _in_hand(self, key: str, shard: str) -> Iterator[None]:
        """The state file says running (with this shard among those in hand) while the attempt runs."""
        with self._lock:
            self._running[key] = shard
            self._state_locked()
        try:
            yield
        finally:
            with self._lock:
                self._running.pop(key, None)

    def _mark_started(self, hand: _Hand, attempt: int) -> bool:
        """Mark the shard running on the rows in hand (no re-read unless one moved on); False: it had ended."""
        item = hand.item
        etag = self.ledger.shard_started(item.job_id, item.shard_id, node=self.config.node_id, pool=self.config.pool,
                                         attempt=attempt, spot=self.config.spot, row=hand.shard, job=hand.job)
        if not etag:
            return False
        hand.etag = "" if etag == "?" else etag
        if hand.job.status != JobState.RUNNING:  # the job has just been marked running: the copy is out of date
            self.jobs.forget(item.job_id)
        return True

    # -- the per-job concurrency cap ----------------------------------------------------
    def _cap(self, job: JobRow) -> int:
        """Running shards allowed per job: the manifest's max_concurrency and UPWELL_MAX_CONCURRENCY,
        the lower of those set; 0 is no cap."""
        caps = [c for c in (job.max_concurrency, self.settings.max_concurrency) if c > 0]
        return min(caps) if caps else 0

    def _over_cap(self, item: WorkItem, cap: int, *, started: bool) -> bool:
        """Before starting: are ``cap`` other shards of the job running? After marking this one
        running: is it among the first ``cap`` by the server's write time? Two agents that both
        passed the first check see the same order in the second, so the later one backs off."""
        active = self.ledger.active_shards(item.job_id)
        if not started:
            return sum(1 for _, sid in active if sid != item.shard_id) >= cap
        return item.shard_id not in [sid for _, sid in sorted(active)[:cap]]

    def _defer(self, hand: _Hand, cap: int, *, started: bool) -> str:
        """Put the message back for a short while; a deferral is not a failure (ShardRow.excused)."""
        item = hand.item
        self.ledger.shard_deferred(item.job_id, item.shard_id, node=self.config.node_id if started else "")
        hand.lease.release(self.config.defer_s + random.randint(0, self.config.defer_s))
        hand.log.info("agent.deferred", max_concurrency=cap)
        return "deferred"

    # -- one attempt ------------------------------------------------------------------
    def _run(self, hand: _Hand) -> str:
        from workers.launch import run_payload

        item = hand.item
        hand.started = now_iso()
        shared = self.config.shared_machine
        waited_before = _thread_cpu_wait() if shared else 0.0
        root = Path(tempfile.mkdtemp(prefix=f"upwell-{_safe_name(item.shard_id)[:40]}-",
                                     dir=self.config.scratch or None))
        try:
            input_path = self._stage_in(item, root)
            resume = self._stage_checkpoint(item, root) if _may_resume(hand) else None
            hand.staging_wait_s = _thread_cpu_wait() - waited_before if shared else 0.0
            hand.log.info("agent.run", attempt=item.attempt, resume=bool(resume), payload=item.payload)
            watch = CancelWatch(self.ledger, item.job_id, self.stop, rows=self.jobs)
            result = run_payload(item, root / "work", input_path=input_path, resume_dir=resume,
                                 stop=watch, on_tick=watch.ticker(hand.lease.renew), ranks=self.config.ranks or None,
                                 definitions=self.definitions, timeout_s=wallclock.shard_timeout(hand.job))
            self._keep_log(item, result)
            if watch.cancelled.is_set() and result.status != "succeeded":
                return self._cancelled(hand, checkpoint=result.checkpoint_dir)
            if result.timed_out and result.status == "failed":  # past the shard's max wall-clock: not retried
                return self._give_up(hand, Verdict(VerdictKind.DROP, reason=wallclock.shard_killed(hand.job)),
                                     stderr_tail=result.stderr_tail, launch=result)
            return self._settle(hand, result, input_path)
        except UpwellError as exc:  # staging, the launcher refusing the parameters, storage
            verdict = decide_attempt(AttemptResult(error=exc), hand.shard, item.attempt, self.attempts)
            if verdict.kind is VerdictKind.POISON:
                return self._give_up(hand, verdict)
            hand.log.warning("agent.transient", error=verdict.reason, code=exc.code)
            try:
                hand.lease.release(verdict.delay_s)
            except UpwellError:
                pass  # the lease lapses on its own: the message comes back all the same
            return "transient"
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def _settle(self, hand: _Hand, result, input_path: Path | None) -> str:
        """Act on how the attempt ended, as decide_attempt rules: preempted, succeeded, retry or poison."""
        item, log = hand.item, hand.log
        finished = now_iso()
        waited = self._cpu_wait(hand, result)
        node_seconds = max(0.0, (seconds_between(hand.started, finished) or result.run_s) - waited)
        verdict = decide_attempt(AttemptResult(status=result.status, exit_code=result.exit_code,
                                               permanent=bool(getattr(result, "permanent", False)),
                                               stopped=self.stop.is_set()),
                                 hand.shard, item.attempt, self.attempts)
        if verdict.kind is VerdictKind.PREEMPTED:
            if result.status != "preempted":
                log.info("agent.stopped_payload_died", exit_code=result.exit_code)
            n = self._stage_checkpoint_out(item, result.checkpoint_dir)
            self.ledger.shard_preempted(item.job_id, item.shard_id, checkpoints=n, node_seconds=node_seconds)
            hand.lease.release(verdict.delay_s)
            log.info("agent.preempted", checkpoint_files=n)
            return "preempted"
        if verdict.kind is VerdictKind.SUCCEEDED:
            self._stage_checkpoint_out(item, result.checkpoint_dir)
            artifacts = self._stage_out(item, result.artifacts, result.checkpoint_dir.parent / "out")
            doc = results.document(item, "succeeded", shard=hand.shard, job=hand.job, node=self._node(),
                                   started=hand.started, finished=finished, launch=result, input_path=input_path,
                                   cpu_wait_s=waited,
                                   artifacts=artifacts, settings=self.settings)
            if not self._cap(hand.job):  # with a cap, shard_released below moves the row on
                _note_row(doc, hand)
            results.write(self.storage, item, doc)
            if self._cap(hand.job):
                self.ledger.shard_released(item.job_id, item.shard_id)  # its slot is free before collect
            hand.lease.delete()
            log.info("agent.succeeded", run_s=round(result.run_s, 3))
            return "succeeded"
        if verdict.kind is VerdictKind.POISON:
            return self._give_up(hand, verdict, stderr_tail=result.stderr_tail, launch=result)
        self.ledger.shard_retry(item.job_id, item.shard_id, error=verdict.reason, stderr_tail=result.stderr_tail,
                                node_seconds=node_seconds)
        hand.lease.release(verdict.delay_s)
        log.warning("agent.failed_will_retry", exit_code=result.exit_code, attempt=item.attempt)
        return "retry"

    def _give_up(self, hand: _Hand, verdict: Verdict, *, stderr_tail: str = "", launch=None) -> str:
        """POISON or DROP: record the failure as the shard's result (collect counts it), then settle."""
        item, poison = hand.item, verdict.kind is VerdictKind.POISON
        doc = results.document(item, "failed", shard=hand.shard, job=hand.job, node=self._node(),
                               started=hand.started, finished=now_iso(), launch=launch, error=verdict.reason,
                               cpu_wait_s=self._cpu_wait(hand, launch),
                               stderr_tail=stderr_tail or hand.shard.stderr_tail, settings=self.settings)
        doc["poisoned"] = poison
        if not self._cap(hand.job):
            _note_row(doc, hand)
        if poison:
            # Before the result: once the result exists, a redelivery only acks, so a crash between
            # the two would lose the poison copy. This order can at worst send it twice.
            self.storage.send(self.poison_name, hand.lease.message.content)
        results.write(self.storage, item, doc)
        if self._cap(hand.job):
            self.ledger.shard_released(item.job_id, item.shard_id)
        hand.lease.delete()
        hand.log.error("agent.poisoned" if poison else "agent.dropped", error=verdict.reason)
        return "poisoned" if poison else "dropped"

    def _cpu_wait(self, hand: _Hand, launch) -> float:
        """On a machine that local nodes share (UPWELL_SHARED_MACHINE, set by upwell up): the time this attempt
        waited for a CPU, its payload's (launch.CpuWait) and its staging's. A node of its own would not have
        spent it, so it is not node time: a local shard costs what its work costs, whatever ran beside it.
        Elsewhere a node's cores are its own: 0."""
        if not self.config.shared_machine:
            return 0.0
        return round(hand.staging_wait_s + float(getattr(launch, "cpu_wait_s", 0.0) or 0.0), 3)

    # -- staging ------------------------------------------------------------------------
    def _stage_in(self, item: WorkItem, root: Path) -> Path | None:
        if not item.input_blob:
            return None
        dest = root / "input" / Path(item.input_blob).name
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(dest, "wb") as fh:
            self.storage.download(item.input_blob, fh)
        return dest

    def _stage_checkpoint(self, item: WorkItem, root: Path) -> Path | None:
        prefix = item.checkpoint_prefix.split("/", 1)[1]
        blobs = list(self.storage.list(names.CHECKPOINTS, prefix))
        if not blobs:
            return None
        dest = root / "resume"
        for b in blobs:
            path = _inside(dest, b.name[len(prefix):])
            if path is None:
                self.log.warning("agent.checkpoint_name_refused", blob=f"{names.CHECKPOINTS}/{b.name}"[:300])
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as fh:
                self.storage.download(f"{names.CHECKPOINTS}/{b.name}", fh)
        return dest

    def _cancelled(self, hand: _Hand, checkpoint: Path | None = None) -> str:
        """The job was cancelled: keep any checkpoint (a re-run resumes from it), mark the shard, drop the message."""
        n = self._stage_checkpoint_out(hand.item, checkpoint)
        self.ledger.shard_cancelled(hand.item.job_id, hand.item.shard_id, checkpoints=n)
        hand.lease.delete()
        hand.log.info("agent.cancelled", checkpoint_files=n)
        return "cancelled"

    def _keep_log(self, item: WorkItem, result) -> None:
        """payload.log is an artifact of every attempt (results/<job>/<shard>/payload.log, the latest
        attempt's); on success it goes up with the outputs, otherwise here."""
        path = getattr(result, "log_path", None)
        if not path or not Path(path).is_file():
            return
        out_dir = Path(result.checkpoint_dir).parent / "out"
        if result.status == "succeeded" and out_dir.is_dir():
            shutil.copyfile(path, out_dir / "payload.log")
            result.artifacts.append(out_dir / "payload.log")
            return
        try:
            with open(path, "rb") as fh:
                self.storage.write(f"{item.result_prefix}/payload.log", fh)
        except UpwellError as exc:
            self.log.warning("agent.log_not_kept", error=str(exc).splitlines()[0][:200], code=exc.code)

    def _stage_checkpoint_out(self, item: WorkItem, ckpt: Path | None) -> int:
        if not ckpt or not Path(ckpt).is_dir():
            return 0
        n = 0
        for path in sorted(Path(ckpt).rglob("*")):
            if _regular(path, ckpt) and not path.name.endswith(".tmp"):
                rel = "/".join(_safe_name(part) for part in path.relative_to(ckpt).parts)
                with open(path, "rb") as fh:
                    self.storage.write(f"{item.checkpoint_prefix}{rel}", fh)
                n += 1
        return n

    def _stage_out(self, item: WorkItem, artifacts, out_dir: Path) -> dict[str, str]:
        out = {}
        for path in artifacts:
            if not _regular(Path(path), out_dir):
                self.log.warning("agent.artifact_refused", artifact=str(path)[:300], reason="not a regular file")
                continue
            name = _safe_name(Path(path).name)
            blob = f"{item.result_prefix}/{name}"
            with open(path, "rb") as fh:
                self.storage.write(blob, fh)
            out[name] = blob
        return out

    def _node(self) -> dict:
        return {"id": self.config.node_id, "pool": self.config.pool, "vm_size": self.config.vm_size,
                "spot": self.config.spot}

    def _state(self, state: str, **extra) -> None:
        with self._lock:
            self._write_state(state, **extra)

    def _state_locked(self) -> None:
        """running (with the shards in hand; ``shard`` is the first) or idle; the caller holds the lock."""
        shards = sorted(self._running.values())
        if shards:
            self._write_state("running", shard=shards[0], shards=shards, slots=max(1, self.config.slots))
        else:
            self._write_state("idle")

    def _write_state(self, state: str, **extra) -> None:
        if not self.config.state_file:
            return
        path = Path(self.config.state_file)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "state": state, "since": time.time(),
                                   "node": self.config.node_id, **extra}))
        os.replace(tmp, path)


def _note_row(doc: dict, hand: _Hand) -> None:
    """Record in the result the shard row as this agent left it, so collect can try its transaction on it
    without reading the row (upwell.results.collect; a row that has moved on since only fails the ETag)."""
    seen = hand.seen_row()
    if seen:
        doc["shard_row"] = seen


_UNSAFE = re.compile(r"[^A-Za-z0-9._+=@-]")


def _may_resume(hand: _Hand) -> bool:
    """Could a checkpoint exist for this shard? Not when its row, as read before this agent marked it
    running (and unchanged since: the mark went through on its ETag), shows no earlier attempt, no
    preemption and no kept checkpoint: checkpoints are only ever uploaded by an attempt, which first marks
    the row. A first delivery so skips the checkpoint listing, one storage call of about a dozen."""
    row = hand.shard
    return not hand.etag or bool(row.attempts or row.preemptions or row.checkpoints)


def _thread_cpu_wait() -> float:
    """Seconds this thread has waited for a CPU while ready to run (its run-queue delay); 0 without /proc."""
    from workers.launch import run_delay_ns

    return (run_delay_ns(f"/proc/self/task/{threading.get_native_id()}/schedstat") or 0) / 1e9


def _safe_name(name: str, limit: int = 200) -> str:
    """One path segment that is safe as a local file name and a blob name segment: no separators,
    no control characters, not '.' or '..' (a backslash would become '/' in a blob name)."""
    safe = _UNSAFE.sub("_", name)[:limit]
    return safe if safe.strip(".") else safe.replace(".", "_") or "_"


def _inside(root: Path, rel: str) -> Path | None:
    """root/rel when it stays inside root (no '..', no absolute part, no backslash tricks), else None."""
    parts = rel.replace("\\", "/").split("/")
    if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts) \
            or any(unicodedata.category(c) == "Cc" for c in rel):
        return None
    path = root.joinpath(*parts)
    base = root.resolve()
    return path if path.resolve().is_relative_to(base) and path.resolve() != base else None


def _regular(path: Path, root: Path) -> bool:
    """A regular file, not a symlink, and inside root (a payload's outputs stay in its work dir)."""
    try:
        return path.is_file() and not path.is_symlink() and path.resolve().is_relative_to(Path(root).resolve())
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="workers.agent", description=__doc__.splitlines()[0])
    parser.add_argument("--pool", default=os.environ.get("UPWELL_POOL", "cpu"))
    parser.add_argument("--idle-exit", type=float, default=env_float(os.environ, "UPWELL_IDLE_EXIT_S", 0.0))
    parser.add_argument("--lease", type=int, default=None)
    parser.add_argument("--max-items", type=int, default=0)
    args = parser.parse_args(argv)
    logs.configure()
    config = AgentConfig.from_env(args.pool, idle_exit_s=args.idle_exit, lease_s=args.lease, max_items=args.max_items)
    agent = Agent(Storage(), config)
    signal.signal(signal.SIGTERM, lambda *_: agent.stop.set())
    signal.signal(signal.SIGINT, lambda *_: agent.stop.set())
    signal.signal(signal.SIGUSR1, lambda *_: agent.drain.set())
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
