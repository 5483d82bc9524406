"""Sharded job counters on Azurite (issue 24, item 3): many finishes at once, the job's end exactly once.

Eight threads finish every shard of one job through the real Ledger, each reading the job first as collect
does. The same run on ONE counter row (the old single hot row: every finish conflicts with every other)
is the baseline, measured in the same test: the conflicts per shard on sixteen rows must stay under half of
it (measured here: 2.9 to 4.1 per shard on one row, 0.07 on sixteen).
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from concurrent.futures import ThreadPoolExecutor

from azure.data.tables import TableTransactionError

from upwell import counters, jobcounts, names
from upwell.jobcounts import Completion
from upwell.ledger import JobRow, JobState, Ledger, ShardRow, ShardState
from upwell.ops.reconcile import Reconciler
from upwell.settings import Settings

SHARDS, THREADS, COST = 200, 8, 0.125  # a power of two: the sum is exact in any order
BASELINE = 64  # shards of the one-row run: its conflicts per shard are steady by then (3 to 4 at 8 threads)


def failed(i: int) -> bool:
    return i % 7 == 3


def new_job(ledger: Ledger, total: int, targets: bool = False) -> str:
    """A running job of ``total`` running shards; ``targets``: with each counter row's count at the end on
    its job row, as ingest writes it (counters.targets), else without, as a job written before them."""
    job_id = f"counters-{uuid.uuid4().hex[:10]}"
    tally = ",".join(map(str, counters.tally(f"s{i:05d}" for i in range(total)))) if targets else ""
    ledger.create_job(JobRow(job_id=job_id, status=JobState.RUNNING, shards_total=total, pool="cpu",
                             counter_targets=tally))
    ledger.add_shards(job_id, [ShardRow(job_id=job_id, shard_id=f"s{i:05d}", status=ShardState.RUNNING)
                               for i in range(total)])
    return job_id


class Counted:
    """Wraps the ledger's table: counts the transactions that failed their condition (a conflict)."""

    def __init__(self, table):
        self.table, self.conflicts, self.transactions = table, 0, 0

    def __getattr__(self, name):
        return getattr(self.table, name)

    def submit_transaction(self, ops):
        self.transactions += 1
        try:
            return self.table.submit_transaction(ops)
        except TableTransactionError:
            self.conflicts += 1
            raise


def finish_all(ledger: Ledger, job_id: str, total: int) -> list[Completion]:
    def finish(i: int) -> Completion:
        status = ShardState.FAILED if failed(i) else ShardState.SUCCEEDED
        return ledger.finish_shard(job_id, f"s{i:05d}", status, {"finished_at": "now"}, cost_usd=COST,
                                   job=ledger.job(job_id))  # as collect: the job read first, its ETags tried

    with ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(finish, range(total)))


def run(store, monkeypatch, rows: int, total: int = SHARDS) -> tuple[Ledger, str, list[Completion], Counted]:
    monkeypatch.setattr(counters, "SHARDS", rows)
    monkeypatch.setattr(jobcounts, "RETRIES", 20 if rows > 1 else 1000)  # one hot row: let every finish land
    ledger = Ledger(store)
    job_id = new_job(ledger, total)
    ledger.table = ledger.counts.table = counted = Counted(ledger.table)
    return ledger, job_id, finish_all(ledger, job_id, total), counted


def test_eight_finishers_count_every_shard_once_and_end_the_job_once(store, monkeypatch):
    _, _, _, single = run(store, monkeypatch, 1, BASELINE)  # the baseline: one row takes every count
    ledger, job_id, done, sharded = run(store, monkeypatch, 16)
    assert sum(c.job_done for c in done) == 1 and all(c.counted for c in done)
    job = ledger.job(job_id)
    n_failed = sum(failed(i) for i in range(SHARDS))
    assert (job.shards_done, job.shards_failed, job.spent_usd) == (SHARDS - n_failed, n_failed, SHARDS * COST)
    assert job.status == JobState.PARTIALLY_FAILED and job.finished_at
    assert all(s.terminal for s in ledger.shards(job_id)) and len(ledger.shards(job_id)) == SHARDS
    assert job.counters == (), "the close folds the counter rows into the job row"
    baseline, now = single.conflicts / BASELINE, sharded.conflicts / SHARDS
    print(f"\nconflicts per shard: one row {baseline:.2f}, {counters.SHARDS} rows {now:.2f}")
    assert now < baseline / 2, (now, baseline)
    assert ledger.finish_shard(job_id, "s00000", ShardState.SUCCEEDED, {}, job=job) == \
        Completion(False, False, job.status.value), "a duplicate is counted once"


def report_requests(store, job_id: str) -> int:
    queue = store.queue(names.REPORT_QUEUE)
    return sum(json.loads(m.content).get("job_id") == job_id for m in queue.peek_messages(max_messages=32))


def test_a_job_no_finisher_saw_complete_is_ended_by_the_reconciler_once(store, monkeypatch):
    # a job without counter targets (written before them): only the recheck window, here none, could close it
    monkeypatch.setattr(counters, "RECHECK_WINDOW", 0)
    store.queue(names.REPORT_QUEUE).clear_messages()
    ledger = Ledger(store)
    job_id = new_job(ledger, 2)
    stale = ledger.job(job_id)  # both finishers read the job before either committed
    assert counters.key("s00000") != counters.key("s00001")
    got = [ledger.finish_shard(job_id, f"s{i:05d}", ShardState.SUCCEEDED, {}, job=stale) for i in (0, 1)]
    assert [c.job_done for c in got] == [False, False]
    job = ledger.job(job_id)
    assert (job.shards_done, job.status) == (2, JobState.RUNNING) and counters.complete(job)
    settings = dataclasses.replace(Settings.from_env(), reconcile_grace_s=0)
    passes = [Reconciler(store, settings, ledger).run(("results",)) for _ in range(2)]
    assert [p.count("unclosed_job") for p in passes] == [1, 0]
    assert ledger.job(job_id).status == JobState.SUCCEEDED
    assert report_requests(store, job_id) == 1
    assert ledger.close_job(job_id) is None, "the job ends once"


def test_counts_given_back_and_listed_with_their_counter_rows(store):
    ledger = Ledger(store)
    job_id = new_job(ledger, 4)
    for i, status in enumerate([ShardState.SUCCEEDED, ShardState.FAILED]):
        ledger.finish_shard(job_id, f"s{i:05d}", status, {}, cost_usd=COST)
    listed = [j for j in ledger.jobs(JobState.RUNNING, pool="cpu") if j.job_id == job_id]
    assert [(j.shards_done, j.shards_failed) for j in listed] == [(1, 1)], "a listing sums an open job's counters"
    assert [s.shard_id for s in ledger.shard_page(job_id, limit=2)[0]] == ["s00000", "s00001"]
    reopened = ledger.reopen_shards(job_id, [ledger.shard(job_id, "s00001")])
    ledger.change_counts(job_id, lambda row: {"shards_failed": row.shards_failed - len(reopened),
                                               "failed_shards": "", "status": JobState.ACCEPTED})
    job = ledger.job(job_id)
    assert (job.shards_done, job.shards_failed, job.spent_usd, job.counters) == (1, 0, 2 * COST, ())
    for i in (1, 2, 3):
        ledger.finish_shard(job_id, f"s{i:05d}", ShardState.SUCCEEDED, {})
    assert ledger.job(job_id).status == JobState.SUCCEEDED


def test_a_shard_of_a_job_that_has_ended_counts_on_the_job_row(store):
    ledger = Ledger(store)
    job_id = new_job(ledger, 2)
    ledger.update_job(job_id, status=JobState.FAILED)  # ended by other means while a shard still ran
    got = ledger.finish_shard(job_id, "s00001", ShardState.FAILED, {}, cost_usd=COST, job=ledger.job(job_id))
    job = ledger.job(job_id)
    assert got == Completion(True, False, JobState.FAILED.value)
    assert (job.shards_done, job.shards_failed, job.spent_usd, job.failed_ids(), job.counters) == \
        (0, 1, COST, ["s00001"], ()), "an ended job keeps no counter rows"


class Reads:
    """Wraps the ledger's table: counts the range queries (reads of a job) and point reads."""

    def __init__(self, table):
        self.table, self.queries, self.gets = table, 0, 0

    def __getattr__(self, name):
        return getattr(self.table, name)

    def query_entities(self, *args, **kwargs):
        self.queries += 1
        return self.table.query_entities(*args, **kwargs)

    def get_entity(self, *args, **kwargs):
        self.gets += 1
        return self.table.get_entity(*args, **kwargs)


def test_kept_views_of_two_processes_and_a_fold_between_count_every_shard_once(store):
    """Two collect processes, each keeping the view its last finish left (upwell.jobviews), finish the
    shards of one job in turn, so each one's view is stale on the rows the other wrote; half-way a re-run
    folds the counter rows into the job row, so both views name rows that are gone. Every shard counts
    once, the job ends once, and the job is read far less often than once a finish (the same finishes
    without kept views are the baseline, in the same test)."""
    from upwell.jobviews import JobViews

    def finish_in_turn(views: list[JobViews] | None, total: int = 120) -> tuple[str, list[Completion], Reads]:
        ledger = Ledger(store)
        job_id = new_job(ledger, total)
        ledger.table = ledger.counts.table = reads = Reads(ledger.table)
        done = []
        for i in range(total):
            if i == total // 2:  # a re-run's fold (it gives nothing back here): every counter row is deleted
                ledger.change_counts(job_id, lambda row: {"status": JobState.RUNNING})
            kept = views[i % 2] if views else None
            status = ShardState.FAILED if failed(i) else ShardState.SUCCEEDED
            got = ledger.finish_shard(job_id, f"s{i:05d}", status, {}, cost_usd=COST,
                                      job=(kept and kept.get(job_id)) or ledger.job(job_id))
            if kept is not None and got.counted:
                kept.keep(job_id, got.view)
            done.append(got)
        return job_id, done, reads

    _, _, baseline = finish_in_turn(None)
    job_id, done, reads = finish_in_turn([JobViews(), JobViews()])
    assert sum(c.job_done for c in done) == 1 and all(c.counted for c in done)
    job = Ledger(store).job(job_id)
    n_failed = sum(failed(i) for i in range(120))
    assert (job.shards_done, job.shards_failed, job.spent_usd, job.counters) == (120 - n_failed, n_failed,
                                                                                120 * COST, ())
    assert job.status == JobState.PARTIALLY_FAILED
    print(f"\njob reads for 120 finishes: {baseline.queries} without kept views, {reads.queries} with "
          f"(and {reads.gets} point reads of a stale row)")
    assert reads.queries <= baseline.queries / 2, (reads.queries, baseline.queries)


def test_with_counter_targets_the_finisher_of_the_last_row_ends_the_job_whatever_the_views(store, monkeypatch):
    """Two collect processes that never read each other's finishes (each keeps the view its own last finish
    left; no recheck window) still end the job, once, with no reconciler: the finish that completes its
    counter row reads the job again, and the last row to complete sees every other complete. The job is read
    at most once a counter row, plus each process's first read."""
    from upwell.jobviews import JobViews

    monkeypatch.setattr(counters, "RECHECK_WINDOW", 0)
    store.queue(names.REPORT_QUEUE).clear_messages()
    total = 120
    ledger = Ledger(store)
    job_id = new_job(ledger, total, targets=True)
    reads = Reads(ledger.table)
    ledger.table = ledger.counts.table = counted = Counted(reads)
    views = [JobViews(), JobViews()]
    done = []
    for i in range(total):
        kept = views[i % 2]
        status = ShardState.FAILED if failed(i) else ShardState.SUCCEEDED
        got = ledger.finish_shard(job_id, f"s{i:05d}", status, {}, cost_usd=COST,
                                  job=kept.get(job_id) or ledger.job(job_id))
        kept.keep(job_id, got.view)
        done.append(got)
    assert [i for i, c in enumerate(done) if c.job_done] == [total - 1], \
        "the last finish (it completed the last counter row to complete) ended the job"
    assert not any(c.job_done for c in done[:-1]) and all(c.counted for c in done)
    job = Ledger(store).job(job_id)
    n_failed = sum(failed(i) for i in range(total))
    assert (job.shards_done, job.shards_failed, job.status, job.counters) == \
        (total - n_failed, n_failed, JobState.PARTIALLY_FAILED, ())
    print(f"\njob reads for {total} finishes in two processes: {reads.queries}, with {counted.conflicts} conflicts")
    # each process's first read, one a counter row completed, and one a conflict (the other process wrote the
    # row since): with targets, a conflict reads the whole range again (one request, as the row alone was), so
    # the view's job row is as fresh as its counter rows; the point reads are the shard rows (no shard given)
    assert reads.queries <= 2 + counters.SHARDS + counted.conflicts, (reads.queries, counted.conflicts)
    assert reads.gets == total, reads.gets
