"""The ingest's lease on its job row (upwell.ingest.lease) and a re-drive's merge (upwell.ingest.accept).

A fake ledger keeps rows in a dict and applies ``change_job`` as the real one does (read, change, write);
the ETag half is the real ledger's, exercised by the fault tests against Azurite.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from upwell.errors import IngestLeased
from upwell.ingest.accept import JobAcceptor, _unsent
from upwell.ingest.lease import IngestLease, live
from upwell.ledger import JobRow, JobState, ShardRow, ShardState
from upwell.settings import Settings

JOB = "j1"


class FakeLedger:
    def __init__(self, job: JobRow, shards: list[ShardRow] = ()):
        self.row = job
        self.rows = {s.shard_id: s for s in shards}

    def job(self, job_id: str) -> JobRow:
        return self.row

    def create_job(self, row: JobRow) -> tuple[JobRow, bool]:
        return self.row, False

    def change_job(self, job_id: str, change) -> dict[str, Any] | None:
        fields = change(self.row)
        if fields is not None:
            fields = {k: v.value if isinstance(v, JobState) else v for k, v in fields.items()}
            known = {f.name for f in dataclasses.fields(JobRow)}
            self.row = dataclasses.replace(self.row, **{k: v for k, v in fields.items() if k in known})
        return fields

    def shards(self, job_id: str) -> list[ShardRow]:
        return sorted(self.rows.values(), key=lambda r: r.shard_id)

    def add_shards(self, job_id: str, rows: list[ShardRow]) -> list[str]:
        made = [r.shard_id not in self.rows for r in rows]
        for r in rows:
            self.rows.setdefault(r.shard_id, r)
        return [f'W/"{r.shard_id}"' if new else "" for r, new in zip(rows, made, strict=True)]


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def progressed(**lease: Any) -> JobRow:
    """A job row that an earlier ingest left half-way: 308 shards counted, $1.50 spent, created at 08:00."""
    return JobRow(job_id=JOB, status=JobState.INGESTING, shards_total=400, shards_done=308, shards_failed=2,
                  spent_usd=1.5, created_at="2026-12-03T08:00:00+00:00", **lease)


def test_a_live_lease_is_never_taken():
    ledger, clock = FakeLedger(progressed(ingest_owner="other", ingest_beat_at=990.0)), Clock(1000.0)
    with pytest.raises(IngestLeased, match="another ingest holds its lease"):
        IngestLease(ledger, JOB, 30, clock).take({"shards_done": 0})
    assert ledger.row.ingest_owner == "other" and ledger.row.shards_done == 308


def test_live_needs_a_beat_younger_than_the_lease():
    assert live(progressed(ingest_beat_at=990.0), 1000.0, 30)
    assert not live(progressed(ingest_beat_at=960.0), 1000.0, 30)
    assert not live(progressed(ingest_beat_at=0.0), 1000.0, 30)  # released, or a row written before leases


def test_a_redrive_takes_a_lapsed_lease_keeps_progress_and_sends_only_the_rest():
    """The fresh job dict has zero counters and a new created_at: none of them reaches the row. Items
    before the lease's mark went out; of the rest, a shard an agent has taken is not sent again."""
    shards = [(f"s{i:05d}", {"r": i}, None, f"d{i}") for i in range(8)]
    running = ShardRow(job_id=JOB, shard_id="s00006", status=ShardState.RUNNING)
    ledger = FakeLedger(progressed(ingest_owner="crashed", ingest_beat_at=900.0, ingest_sent=4), [running])
    acceptor = JobAcceptor(storage=None, settings=Settings(), ledger=ledger)  # type: ignore[arg-type]
    fresh = {"job_id": JOB, "status": "ingesting", "pool": "cpu", "shards_done": 0, "shards_failed": 0,
             "spent_usd": 0.0, "created_at": "2026-12-03T09:59:00+00:00", "shards_total": 400, "name": "again"}
    lease = IngestLease(ledger, JOB, 30, Clock(1000.0))
    started = acceptor._open(fresh, lease)
    acceptor._write_rows(fresh, shards, lease)
    todo = [i for i, _ in _unsent(shards, started, lease)]
    row = ledger.row
    assert todo == [4, 5, 7]
    assert (row.shards_done, row.shards_failed, row.spent_usd) == (308, 2, 1.5)
    assert row.created_at == "2026-12-03T08:00:00+00:00"
    assert row.name == "again" and row.status == JobState.INGESTING
    assert (row.ingest_owner, row.ingest_beat_at, row.ingest_sent) == (lease.owner, 1000.0, 4)
    assert ledger.rows["s00006"].status == ShardState.RUNNING and len(ledger.rows) == 8


def test_a_holder_whose_lease_was_taken_over_stops_at_its_next_beat():
    clock = Clock(1000.0)
    ledger = FakeLedger(progressed())
    first = IngestLease(ledger, JOB, 30, clock)
    first.take({})
    first.renew(10)
    clock.now += 31  # the first holder stalled past its lease
    second = IngestLease(ledger, JOB, 30, clock)
    assert second.take({}) is not None and second.sent == 0
    with pytest.raises(IngestLeased, match="took it over"):
        first.renew(20)
    assert ledger.row.ingest_owner == second.owner


def test_renew_beats_at_most_every_sixth_of_the_lease_and_never_lowers_the_mark():
    clock = Clock(1000.0)
    ledger = FakeLedger(progressed())
    lease = IngestLease(ledger, JOB, 30, clock)
    lease.take({})
    lease.renew(5)
    assert ledger.row.ingest_sent == 0  # within 5 s of the last beat: no write
    clock.now += 5
    lease.renew(7)
    assert (ledger.row.ingest_beat_at, ledger.row.ingest_sent) == (1005.0, 7)
    clock.now += 5
    lease.renew(3)
    assert ledger.row.ingest_sent == 7


def test_finish_accepts_and_releases_but_keeps_a_job_that_ended_meanwhile():
    ledger = FakeLedger(progressed())
    lease = IngestLease(ledger, JOB, 30, Clock())
    lease.take({})
    assert lease.finish(accepted_at="now")
    assert (ledger.row.status, ledger.row.ingest_beat_at) == (JobState.ACCEPTED, 0.0)
    ledger = FakeLedger(progressed())
    lease = IngestLease(ledger, JOB, 30, Clock())
    lease.take({})
    ledger.row = dataclasses.replace(ledger.row, status=JobState.SUCCEEDED)  # every shard counted meanwhile
    assert not lease.finish(accepted_at="now")
    assert (ledger.row.status, ledger.row.ingest_beat_at) == (JobState.SUCCEEDED, 0.0)


def test_release_gives_up_only_its_own_lease():
    ledger = FakeLedger(progressed(ingest_owner="other", ingest_beat_at=990.0))
    IngestLease(ledger, JOB, 30, Clock()).release()
    assert ledger.row.ingest_beat_at == 990.0
