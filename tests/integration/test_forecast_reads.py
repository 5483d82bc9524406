"""Issue 24, item 4: what the estimate's learning reads is bounded, however many jobs ever ran.

``upwell.cost.forecast.learn`` looks among the newest ``LOOKBACK`` entries of the ledger's index of ended
jobs, reads their rows newest first until it has ``max_jobs`` of the payload and pool, and one page of
each one's shard rows. Its storage requests, counted by ``tests.faults.request_meter``, are the same after
10 and after 200 finished jobs of other payloads, and never more than one range read and ``LOOKBACK``
point reads when the payload has no history at all.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.faults.request_meter import RequestMeter
from tests.pipeline_helpers import module_azurite
from upwell import names
from upwell.cost import forecast
from upwell.ledger import JobRow, JobState, Ledger, ShardRow, ShardState
from upwell.storage import Storage

WANTED = 3  # finished jobs of the payload learned from (the newest)
azurite = module_azurite("forecast")  # its own: the index's newest entries are this module's


@pytest.fixture
def store(azurite) -> Storage:
    s = Storage(azurite.connection_string)
    s.ensure()
    return s


def finished(store: Storage, payload: str, ids: range, ended_key) -> None:
    """Finished jobs of ``payload`` on cpu, two succeeded shards of 30 node-seconds each, ended as
    ``ended_key(i)`` says (an index RowKey: older ones sort later)."""
    jobs, index = store.table(names.JOBS_TABLE), store.table(names.JOB_INDEX_TABLE)

    def one(i: int) -> None:
        job_id = f"{payload}-{i:05d}"
        job = JobRow(job_id=job_id, status=JobState.SUCCEEDED, pool="cpu", payload=payload, shards_total=2,
                     shards_done=2)
        shards = [ShardRow(job_id=job_id, shard_id=f"s{k:05d}", status=ShardState.SUCCEEDED, pool="cpu",
                           params='{"a": 1}', node_seconds=30.0) for k in range(2)]
        jobs.submit_transaction([("upsert", r.to_entity()) for r in (job, *shards)])
        index.upsert_entity({"PartitionKey": "jobs", "RowKey": f"ended-{ended_key(i):013d}-{job_id}",
                             "job_id": job_id})

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, ids))


def learned(store: Storage, payload: str, max_jobs: int) -> tuple[forecast.History, int]:
    meter = RequestMeter()
    with meter:
        hist = forecast.learn(Ledger(store), payload, "cpu", max_jobs=max_jobs)
    return hist, meter.total


def test_learning_reads_the_same_after_10_and_200_other_jobs(store):
    payload, other = f"want{uuid.uuid4().hex[:6]}", f"other{uuid.uuid4().hex[:6]}"
    finished(store, payload, range(WANTED), lambda i: 10**12 + i)  # the newest entries of the index
    counts = {}
    for n in (10, 200):
        finished(store, other, range(n), lambda i: 9 * 10**12 + i)  # ended long before
        hist, counts[n] = learned(store, payload, WANTED)
        assert hist.jobs == WANTED and hist.all == [30.0] * 2 * WANTED, hist
    # one range read of the index, then each wanted job's row and its page of shard rows
    assert counts[10] == counts[200] == 1 + 2 * WANTED, counts
    hist, none = learned(store, f"never{uuid.uuid4().hex[:6]}", forecast.MAX_JOBS)
    assert hist.jobs == 0 and none == 1 + forecast.LOOKBACK, none  # 200 others: the look-back is full
