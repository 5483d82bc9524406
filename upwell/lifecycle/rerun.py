"""Re-run some of a job's shards: the failed ones, named ones, every unfinished one, or all.

Each shard to re-run must have ended (succeeded, failed or cancelled). Its result and artifacts are removed (a
result is written once, so the old one would make the new run a duplicate), its row goes back to queued with
fresh attempt counters (100 rows to an entity-group transaction), the job's counters give it back, and a new
work item is sent (several requests in flight at each step). A cancelled shard keeps its checkpoint and
resumes from it; a failed or succeeded one starts afresh. The job is reported again when its last shard ends.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

from upwell import logs, names
from upwell.errors import UpwellError
from upwell.ingest.fanout import send_in_order
from upwell.ledger import JobRow, JobState, Ledger, ShardRow, ShardState
from upwell.messages import WorkItem, encode
from upwell.settings import Settings
from upwell.storage import Storage
from upwell.timeutil import now_iso

log = logs.get("upwell.lifecycle.rerun")
WORKERS = 4  # requests in flight: a re-run of 100,000 shards is batched, not one shard after another


def choose(shards: list[ShardRow], *, failed: bool = False, shard_ids: list[str] | None = None,
           everything: bool = False) -> list[ShardRow]:
    """Which shard rows a re-run takes: named ones; else the failed ones; else all; else every one not succeeded."""
    by_id = {s.shard_id: s for s in shards}
    if shard_ids:
        unknown = [s for s in shard_ids if s not in by_id]
        if unknown:
            raise UpwellError(f"no shard {', '.join(unknown)} in this job (shards: {', '.join(sorted(by_id)[:8])}"
                              f"{' ...' if len(by_id) > 8 else ''})")
        chosen = [by_id[s] for s in dict.fromkeys(shard_ids)]
    elif failed:
        chosen = [s for s in shards if s.status == ShardState.FAILED]
    elif everything:
        chosen = list(shards)
    else:
        chosen = [s for s in shards if s.status != ShardState.SUCCEEDED]
    busy = [s.shard_id for s in chosen if not s.terminal]
    if busy:
        raise UpwellError(f"shard(s) {', '.join(busy[:8])} have not ended yet (queued or running); "
                          "wait for them, or `upwell cancel` the job first")
    return sorted(chosen, key=lambda s: s.shard_id)


def rerun_job(storage: Storage, job_id: str, *, failed: bool = False, shard_ids: list[str] | None = None,
              everything: bool = False, ledger: Ledger | None = None) -> list[str]:
    """Re-run the chosen shards; returns their ids (empty: nothing to re-run)."""
    ledger = ledger or Ledger(storage)
    job = ledger.job(job_id)
    if job is None:
        raise UpwellError(f"no such job {job_id}")
    if job.status in (JobState.REJECTED, JobState.INGESTING, JobState.WAITING):
        raise UpwellError(f"job {job_id} is {job.status.value}: it has no shards to re-run (upload it again)")
    chosen = choose(ledger.shards(job_id), failed=failed, shard_ids=shard_ids, everything=everything)
    if not chosen:
        return []
    texts = {s.shard_id: encode(_item(job, s)) for s in chosen}
    with ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="rerun") as pool:  # a result is written once:
        list(pool.map(lambda s: _forget_result(storage, job_id, s.shard_id,  # the old one goes first
                                               keep_checkpoint=s.status == ShardState.CANCELLED), chosen))
    reopened = ledger.reopen_shards(job_id, chosen, WORKERS)
    done = sum(1 for w in reopened.values() if w == ShardState.SUCCEEDED)
    failed_n = sum(1 for w in reopened.values() if w == ShardState.FAILED)
    ledger.change_counts(job_id, lambda row: {  # the counts given back: summed with its counter rows
        "status": JobState.ACCEPTED, "reported": False, "report_claimed": 0.0, "finished_at": "",
        "shards_done": max(0, row.shards_done - done), "shards_failed": max(0, row.shards_failed - failed_n),
        "failed_shards": ",".join(s for s in row.failed_ids() if s not in reopened),
        "reruns": row.reruns + 1, "message": f"re-run of {len(reopened)} shard(s) at {now_iso()}"})
    queue = names.work_queue(job.pool)
    sends = ((i, texts[sid]) for i, sid in enumerate(sorted(reopened)))
    send_in_order(sends, lambda _, text: storage.send(queue, text), lambda _: None, workers=WORKERS, per_s=0)
    log.info("rerun.queued", job_id=job_id, shards=len(reopened))
    return sorted(reopened)


def _item(job: JobRow, shard: ShardRow) -> WorkItem:
    job_id, sid = job.job_id, shard.shard_id
    return WorkItem(job_id=job_id, shard_id=sid, payload=job.payload, pool=job.pool, params=shard.parameters(),
                    payload_version=job.payload_version, payload_sha256=job.payload_sha256,
                    input_blob=shard.input_blob or None, input_range=json.loads(shard.input_range or "null"),
                    checkpoint_prefix=f"{names.CHECKPOINTS}/{job_id}/{sid}/",
                    result_prefix=f"{names.RESULTS}/{job_id}/{sid}", ranks=job.ranks or 1, gpus=job.gpus,
                    points=shard.block())  # a block's points run again (upwell.ingest.blocks)


def _forget_result(storage: Storage, job_id: str, shard_id: str, *, keep_checkpoint: bool) -> None:
    from upwell.lifecycle.cleanup import delete_prefix

    delete_prefix(storage, names.RESULTS, f"{job_id}/{shard_id}/")
    delete_prefix(storage, names.RESULTS, f"{job_id}/{shard_id}.json", exact=True)
    if not keep_checkpoint:
        delete_prefix(storage, names.CHECKPOINTS, f"{job_id}/{shard_id}/")


def rerun_reduce(storage: Storage, job_id: str, settings: Settings | None = None) -> str:
    """Run the job's reduce step alone again (``upwell rerun JOB --reduce``), as a new attempt with its
    definition as registered now; the new reduce job's id (upwell.after.reduce)."""
    from upwell.after.reduce import rerun

    return rerun(storage, settings or Settings.from_env(), job_id)
