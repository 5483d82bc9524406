"""Sharded job counters (issue 24, item 3): the key range, the choice of counter row and the sums."""

from __future__ import annotations

import zlib
from dataclasses import replace

import pytest

from upwell import counters, names
from upwell.counters import Counter
from upwell.rows import FAILED_KEPT, JobRow, JobState


class Entity(dict):
    """A table entity as the SDK returns it: its properties, and its ETag in ``metadata``."""

    def __init__(self, etag: str = "", **props):
        super().__init__(props)
        self.metadata = {"etag": etag}


def job_entities() -> list[Entity]:
    return [Entity('W/"j"', PartitionKey="J", RowKey="job", status="running", shards_total=10, shards_done=2,
                   shards_failed=1, spent_usd=0.5, failed_shards="s00001"),
            Entity('W/"c3"', PartitionKey="J", RowKey="job.c03", done=3, failed=1, spent_usd=0.25,
                   failed_shards="s00007"),
            Entity('W/"c0"', PartitionKey="J", RowKey="job.c00", done=1, failed=0, spent_usd=0.125)]


def test_counter_rows_sort_between_the_job_row_and_every_shard_row():
    keys = [counters.key(f"s{i:05d}") for i in range(2000)]
    assert set(keys) == {f"job.c{i:02d}" for i in range(counters.SHARDS)}, "every counter row is used"
    for k in [*keys, names.JOB_ROW]:
        assert names.JOB_ROW <= k < counters.END and counters.in_job_range(k)
    for shard in ("s00000", "s99999", "a", "jobs", "job0", "zzz"):
        assert not counters.in_job_range(shard), shard
    assert not counters.in_job_range("job/") and not counters.in_job_range("jo")


def test_a_shard_always_counts_on_the_same_row():
    assert counters.key("s00042") == counters.key("s00042") == f"job.c{zlib.crc32(b's00042') % 16:02d}"
    assert counters.key("s00042", shards=1) == "job.c00"


def test_the_job_is_its_own_figures_plus_its_counters():
    job = counters.summed(reversed(job_entities()))
    assert (job.shards_done, job.shards_failed, job.spent_usd) == (6, 2, 0.875)
    assert job.failed_ids() == ["s00001", "s00007"]
    assert [c.key for c in job.counters] == ["job.c00", "job.c03"] and job.counters[1].etag == 'W/"c3"'
    assert job.etag == 'W/"j"' and job.status == JobState.RUNNING
    own = job.to_entity()  # what a writer of the job row writes back: its own figures, never the sums
    assert (own["shards_done"], own["shards_failed"], own["spent_usd"], own["failed_shards"]) == (2, 1, 0.5, "s00001")
    assert "counters" not in own and "base" not in own


def test_a_job_without_counter_rows_reads_as_before():
    job = counters.summed(job_entities()[:1])
    assert (job.shards_done, job.shards_failed, job.spent_usd, job.counters) == (2, 1, 0.5, ())
    assert counters.summed([]) is None and counters.summed(job_entities()[1:]) is None


def test_a_counter_bumped_and_replaced_moves_the_sums():
    job = counters.summed(job_entities())
    row = counters.counter(job, "job.c09")
    assert row == Counter("job.c09") and row.etag == ""  # not written yet: the finish inserts it
    after = counters.replaced(job, row.bumped(False, 0.25, "s00009"), "job.c09")
    assert (after.shards_done, after.shards_failed, after.spent_usd) == (6, 3, 1.125)
    assert after.failed_ids() == ["s00001", "s00007", "s00009"]
    gone = counters.replaced(after, None, "job.c03")
    assert (gone.shards_done, gone.shards_failed) == (3, 2)


def test_failed_ids_are_bounded_on_each_row_and_in_the_sum():
    row = Counter("job.c01")
    for i in range(FAILED_KEPT + 5):
        row = row.bumped(False, 0.0, f"s{i:05d}")
    assert row.failed == FAILED_KEPT + 5 and len(row.failed_ids()) == FAILED_KEPT
    job = counters.with_counters(JobRow(job_id="J", failed_shards="x"), [row])
    assert len(job.failed_ids()) == FAILED_KEPT and job.failed_ids()[0] == "x"


@pytest.mark.parametrize(("done", "failed", "total", "terminal", "want"), [
    (10, 0, 10, False, JobState.SUCCEEDED), (7, 3, 10, False, JobState.PARTIALLY_FAILED),
    (0, 10, 10, False, JobState.FAILED), (9, 0, 10, False, None), (10, 0, 10, True, None), (0, 0, 0, False, None)])
def test_a_job_is_complete_once_every_shard_is_counted(done, failed, total, terminal, want):
    job = JobRow(job_id="J", shards_done=done, shards_failed=failed, shards_total=total,
                 status=JobState.SUCCEEDED if terminal else JobState.RUNNING)
    assert counters.complete(job) is (want is not None)
    if want is not None:
        assert counters.final_state(job) == want
    if not terminal:  # a cancelled job is not ended: its close is owed as well once every shard is counted
        assert counters.complete(replace(job, status=JobState.CANCELLED)) is (want is not None)


def test_targets_count_each_rows_shards_and_hold_only_while_the_job_row_counts_none():
    ids = [f"s{i:05d}" for i in range(40)]
    tally = counters.tally(ids)
    assert sum(tally) == 40 and tally == counters.tally(ids[20:], counters.tally(ids[:20])), "a running tally"
    assert all(tally[int(counters.key(s)[-2:])] for s in ids)
    text = ",".join(map(str, tally))
    fresh = counters.summed([Entity('W/"j"', PartitionKey="J", RowKey="job", status="running", shards_total=40,
                                    shards_done=0, shards_failed=0, spent_usd=0.0, counter_targets=text),
                             Entity('W/"c"', PartitionKey="J", RowKey="job.c03", done=2, failed=1)])
    assert counters.targets(fresh) == tally, "counter rows' own counts do not matter"
    assert counters.targets(replace(fresh, counter_targets="")) is None, "written before targets"
    assert counters.targets(replace(fresh, shards_total=41)) is None, "targets of other shards"
    assert counters.targets(replace(fresh, counter_targets="1,2,x")) is None
    folded = replace(fresh, base={**fresh.base, "shards_done": 5})
    assert counters.targets(folded) is None, "a re-run folded counted shards into the job row"
