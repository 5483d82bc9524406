"""The job views a collect process keeps between finishes (upwell.jobviews): pure, no storage."""

from __future__ import annotations

from upwell import counters
from upwell.counters import Counter
from upwell.jobviews import JobViews
from upwell.rows import JobRow, JobState


def view(job_id: str, *rows: Counter, etag: str = "e1", status: JobState = JobState.RUNNING) -> JobRow:
    return counters.with_counters(JobRow(job_id=job_id, status=status, shards_total=100, etag=etag), rows)


def test_concurrent_finishes_keep_per_row_the_view_that_counted_more():
    views = JobViews()
    views.keep("j", view("j", Counter("job.c01", done=3, etag="a3"), Counter("job.c02", done=1, etag="b1")))
    # a finish that began before the first committed: stale on c01, newer on c02
    views.keep("j", view("j", Counter("job.c01", done=2, etag="a2"), Counter("job.c02", done=2, etag="b2")))
    kept = views.get("j")
    assert {c.key: c.etag for c in kept.counters} == {"job.c01": "a3", "job.c02": "b2"}
    assert kept.shards_done == 5, "the sums follow the rows kept"


def test_a_new_job_row_etag_replaces_the_view_and_an_ended_job_or_none_is_forgotten():
    views = JobViews()
    views.keep("j", view("j", Counter("job.c01", done=9, etag="a9")))
    views.keep("j", view("j", Counter("job.c01", done=1, etag="x1"), etag="e2"))  # after a fold: a new epoch
    assert [c.etag for c in views.get("j").counters] == ["x1"]
    views.keep("j", view("j", status=JobState.SUCCEEDED))
    assert views.get("j") is None
    views.keep("k", view("k"))
    views.keep("k", None)
    assert views.get("k") is None


def test_the_least_recently_used_job_is_forgotten_first():
    views = JobViews(max_jobs=2)
    views.keep("a", view("a"))
    views.keep("b", view("b"))
    assert views.get("a") is not None  # a is now the most recent
    views.keep("c", view("c"))
    assert (views.get("a") is not None, views.get("b"), views.get("c") is not None) == (True, None, True)
