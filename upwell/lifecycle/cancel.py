"""Cancel a job: stop its dispatch, drain its queued messages, and have its running shards checkpoint and stop.

The job row's status becomes "cancelled" first, so every later delivery of its messages is dropped by the
agent. Then queued shards are marked cancelled (100 rows to an entity-group transaction, several at once), and
the job's visible messages are taken off its pool's queue. Messages of other jobs that the drain had to
receive go back at once, each counted as a deferral on its shard (a delivery put back is not a failure).
Running shards are stopped by their agents, which look at the job row on every lease tick: the payload gets
its stop signal, writes its checkpoint (kept for a re-run) and the shard becomes "cancelled".
"""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from upwell import logs, names
from upwell.errors import DecodeError, NotFound, UpwellError
from upwell.lease import Lease
from upwell.ledger import JobState, Ledger, ShardState
from upwell.messages import decode
from upwell.storage import Storage
from upwell.timeutil import now_iso

log = logs.get("upwell.lifecycle.cancel")
IN_PROGRESS = (ShardState.RUNNING,)


@dataclass(frozen=True)
class Cancelled:
    job_id: str
    queued: int  # shards that had not started, now cancelled
    drained: int  # messages taken off the queue
    running: int  # shards that were running when the cancel came
    still_running: int  # of those, how many had not stopped when we stopped waiting
    # Per state, what became of the shards: (state at the cancel, state after it, count), every shard once; a
    # running shard that finished on its own is (running, succeeded), not a cancelled one.
    outcome: tuple[tuple[str, str, int], ...] = ()


def cancel_job(storage: Storage, job_id: str, *, wait_s: float = 60.0, ledger: Ledger | None = None) -> Cancelled:
    ledger = ledger or Ledger(storage)
    job = ledger.job(job_id)
    if job is None:
        raise UpwellError(f"no such job {job_id}")
    if job.terminal:
        raise UpwellError(f"job {job_id} has already finished ({job.status.value}); nothing to cancel")
    ledger.change_job(job_id, lambda row: None if row.terminal or row.status == JobState.CANCELLED else
                      {"status": JobState.CANCELLED, "cancelled_at": now_iso(),
                       "status_before_cancel": row.status.value, "message": f"cancelled at {now_iso()}"})
    shards = ledger.shards(job_id)
    running = [s.shard_id for s in shards if s.status in IN_PROGRESS]
    queued = ledger.cancel_shards(job_id, [s for s in shards if not s.terminal and s.status not in IN_PROGRESS])
    drained = drain_messages(storage, ledger, job.pool, job_id) if job.pool else 0
    still = _wait_stopped(ledger, job_id, running, wait_s)
    after = {s.shard_id: s.status.value for s in ledger.shards(job_id)}
    moves = Counter((s.status.value, after.get(s.shard_id, "deleted")) for s in shards)
    log.info("cancel.done", job_id=job_id, queued=queued, drained=drained, running=len(running),
             still_running=len(still))
    return Cancelled(job_id, queued, drained, len(running), len(still),
                     tuple((was, now, n) for (was, now), n in sorted(moves.items())))


def _wait_stopped(ledger: Ledger, job_id: str, running: list[str], wait_s: float) -> list[str]:
    deadline = time.monotonic() + wait_s
    left = list(running)
    while left:
        left = [sid for sid in left if (row := ledger.shard(job_id, sid)) is not None and row.status in IN_PROGRESS]
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    return left


def drain_messages(storage: Storage, ledger: Ledger, pool: str, job_id: str, *, limit: int = 100_000) -> int:
    """Delete the job's visible messages from work-<pool>; put every other message back at once.

    Others stay invisible until the drain ends, so each is received once; each counts as a deferral."""
    queue = names.work_queue(pool)
    others, deleted, seen = [], 0, 0
    try:
        while seen < limit:
            batch = storage.receive_many(queue, visibility_timeout=60, max_messages=32)
            if not batch:
                break
            seen += len(batch)
            mine = []
            for msg in batch:
                owner, shard = _owner(msg.content)
                (mine if owner == job_id else others).append((msg, owner, shard))
            with ThreadPoolExecutor(max_workers=8, thread_name_prefix="drain") as pool:  # one already gone is fine
                list(pool.map(lambda m: Lease(storage.queue(queue), m[0], 60).delete(), mine))
            deleted += len(mine)
    finally:
        for msg, owner, shard in others:
            if owner and shard:
                ledger.shard_deferred(owner, shard)
            try:
                Lease(storage.queue(queue), msg, 60).release(0)
            except NotFound:
                pass
    return deleted


def _owner(content) -> tuple[str, str]:
    try:
        item = decode(content)
    except DecodeError:
        return "", ""
    return item.job_id, item.shard_id


