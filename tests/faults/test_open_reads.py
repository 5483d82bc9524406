"""Issue 23, acceptance e: a scale run with 1,000 finished jobs reads the open jobs' rows plus a constant.

The world: a fresh Azurite holding 1,000 finished jobs (a job row and a shard row each, and their
ended entries in the ledger's index, ended long ago, written in entity-group transactions), the devhost
on the real function_app, and a real job of ``SHARDS`` shards that real local agents run. While they run,
one run of the scale timer (``handlers.scale.scale``: the autoscaler, the report fallback, the
waiting-manifest recheck) is metered: every entity the Table service would read to answer its calls
(tests.faults.table_meter: point and range queries read what they return, a scan reads its partition or
the whole table). It must read exactly the open jobs' rows plus one state row per pool (``expected_reads``
says which); a scan of the old kind, under the same meter, reads them all. The dashboard reads the open
jobs plus a bounded number of the latest ended ones. Then the job finishes with nothing lost.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest

import handlers.scale
from tests.faults import harness
from tests.faults.table_meter import Meter
from upwell import jobindex, names
from upwell.ledger import JobRow, JobState, Ledger, ShardRow, ShardState
from upwell.nodelog import NodeLog
from upwell.ops import dashboard
from upwell.results import publish
from upwell.settings import Settings

pytestmark = pytest.mark.cloudfaults
FINISHED = 1000
SHARDS = 3


def seed_finished(storage, n: int) -> None:
    """``n`` succeeded jobs of one shard each, and the index's ended entries, in transactions."""
    jobs = storage.table(names.JOBS_TABLE)

    def one(i: int) -> None:
        job_id = f"done-{i:05d}"
        job = JobRow(job_id=job_id, status=JobState.SUCCEEDED, pool="cpu", shards_total=1, shards_done=1,
                     created_at=f"2026-01-01T00:{i // 60 % 60:02d}:{i % 60:02d}.000Z", reported=True)
        shard = ShardRow(job_id=job_id, shard_id="s00000", status=ShardState.SUCCEEDED, pool="cpu")
        jobs.submit_transaction([("upsert", job.to_entity()), ("upsert", shard.to_entity())])

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, range(n)))
    index = storage.table(names.JOB_INDEX_TABLE)
    # ended in 2001 and before (inverted milliseconds, as jobindex writes them): outside any recent window
    ended = [{"PartitionKey": jobindex.PARTITION, "RowKey": f"{jobindex.ENDED}{9 * 10**12 + i:013d}-done-{i:05d}",
              "job_id": f"done-{i:05d}"} for i in range(n)]
    for start in range(0, n, 100):
        index.submit_transaction([("upsert", e) for e in ended[start:start + 100]])


def expected_reads(ledger: Ledger, nodes: NodeLog, settings: Settings) -> int:
    """What one run of the scale timer must read: the autoscaler reads each open job's index entry and row,
    each active job's partition (the job row and its shard rows, which the in-flight count scans), each
    pool's policy state row and each pool's partition of the nodes table (a row per live agent: bounded by
    the pool's size, not by the jobs ever run); the waiting-manifest recheck reuses that read of the open
    jobs; the report fallback reads the jobs that ended in the last REPORT_WINDOW_S (an entry and a row each)."""
    open_jobs = ledger.open_jobs()
    active = [j for j in open_jobs if j.status in (JobState.ACCEPTED, JobState.RUNNING)]
    ended = ledger.index.ended_since(publish.REPORT_WINDOW_S)
    agents = sum(len(nodes.nodes(pool)) for pool in settings.pools)
    return (len(settings.pools) + agents + 2 * len(open_jobs) + sum(1 + len(ledger.shards(j.job_id)) for j in active)
            + 2 * len(ended))


def test_a_scale_run_reads_the_open_rows_not_the_finished_ones(stack, monkeypatch):
    # The host's scale timer stays out of the way of the measured run (one Autoscaler, one lock); the
    # ingest's scale pass (UPWELL_SCALE_ON_INGEST, on in the deployment) starts the agents.
    harness.apply_env(monkeypatch, {"UPWELL_SCALE_SCHEDULE": "0 0 0 1 1 *", "UPWELL_SCALE_ON_INGEST": "1"})
    settings = Settings.from_env()
    ledger, nodelog, pools = Ledger(stack.storage), NodeLog(stack.storage), len(settings.pools)
    seed_finished(stack.storage, FINISHED)
    with harness.recorded("1,000 finished jobs (scale reads)", shards=SHARDS) as counts:
        with harness.in_process_host(stack):
            job_id = harness.upload(stack.storage, "cloudfaults/open-reads/job.yaml",
                                    harness.sweep("open reads", SHARDS, sleep_s=4))
            harness.wait_until(lambda: sum(s.status == "running" for s in ledger.shards(job_id)) == SHARDS,
                               90, "real agents running every shard")
            with pytest.MonkeyPatch.context() as patch:
                expected = expected_reads(ledger, nodelog, settings)  # this ledger's clients came before the meter
                meter = Meter().install(patch)
                handlers.scale.autoscaler.cache_clear()  # an Autoscaler whose clients are metered
                handlers.scale.scale(None)  # one run of the scale timer, as the host calls it
                run = dict(meter.reads)
                assert expected_reads(ledger, nodelog, settings) == expected, "the open work changed meanwhile"
                metered = Ledger(stack.storage)
                meter.reset()  # the dashboard: the open jobs, and a bounded few of those that ended
                listed = dashboard.jobs(metered, datetime.now(UTC))
                dash = meter.total
                meter.reset()  # the meter does see a scan of the old kind: every entity of the table
                list(metered.table.query_entities("RowKey eq 'job'"))  # the job rows, no PartitionKey
                scan = meter.total
            handlers.scale.autoscaler.cache_clear()
            harness.verify(stack, job_id, counts)
        harness.no_orphans(stack)
    # one open job of SHARDS shards: 2 reads of its entry and row, its partition, a state row per pool, and
    # the node rows of the SHARDS agents that run them
    assert expected == pools + 2 + 1 + SHARDS + SHARDS, expected
    assert sum(run.values()) == expected, (run, expected)
    assert set(run) == {names.JOB_INDEX_TABLE, names.JOBS_TABLE, names.SCALE_TABLE, names.NODES_TABLE}, run
    assert scan >= 2 * FINISHED, scan
    assert listed[0]["job_id"] == job_id and len(listed) == dashboard.JOB_LIMIT, listed[:2]
    assert dash <= (expected - pools) + 2 * dashboard.JOB_LIMIT + 2 * dashboard.DETAIL_LIMIT, dash
    assert counts.lost == 0
