"""decide_delivery, decide_claim and decide_attempt: every rule of an attempt's fate, table-driven."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from upwell.errors import InputRejected, NotFound, TransientError
from upwell.rows import JobRow, ShardRow
from upwell.verdict import (
    AttemptConfig,
    AttemptResult,
    Verdict,
    VerdictKind,
    concurrency_cap,
    decide_attempt,
    decide_claim,
    decide_delivery,
)

CFG = AttemptConfig(max_failures=5, retry_backoff_s=2.0, max_backoff_s=60.0)
K = VerdictKind


def shard(preemptions: int = 0, deferrals: int = 0) -> ShardRow:
    return ShardRow(job_id="j", shard_id="s", preemptions=preemptions, deferrals=deferrals)


def job(budget: float | None = None, spent: float = 0.0) -> JobRow:
    return JobRow(job_id="j", budget_usd=budget, spent_usd=spent)


DELIVERIES = [
    # name, decoded, result exists, dequeue count, shard, job, kind, reason contains
    ("undecodable", False, False, 1, shard(), job(), K.POISON, "cannot be decoded"),
    ("result exists: a duplicate", True, True, 3, shard(), job(), K.DONE, "duplicate"),
    ("result exists wins over budget", True, True, 1, shard(), job(1.0, 5.0), K.DONE, ""),
    ("first delivery runs", True, False, 1, shard(), job(), K.RUN, ""),
    ("four failures: fifth try runs", True, False, 5, shard(), job(), K.RUN, ""),
    ("five failures: poison", True, False, 6, shard(), job(), K.POISON, "failed 5 times (maxDequeueCount 5)"),
    ("preemptions are excused", True, False, 8, shard(preemptions=3), job(), K.RUN, ""),
    ("deferrals are excused", True, False, 8, shard(deferrals=2, preemptions=1), job(), K.RUN, ""),
    ("excused, then five failures", True, False, 9, shard(preemptions=3), job(), K.POISON, "5 times"),
    ("under budget runs", True, False, 1, shard(), job(10.0, 9.99), K.RUN, ""),
    ("at budget: dropped", True, False, 1, shard(), job(10.0, 10.0), K.DROP, "spent $10.00 of $10.00"),
    ("no budget never drops", True, False, 1, shard(), job(None, 1e9), K.RUN, ""),
]


@pytest.mark.parametrize("name, decoded, exists, count, row, j, kind, says", DELIVERIES,
                         ids=[d[0] for d in DELIVERIES])
def test_decide_delivery_table(name, decoded, exists, count, row, j, kind, says):
    v = decide_delivery(decoded=decoded, result_exists=exists, dequeue_count=count, shard=row, job=j, config=CFG)
    assert v.kind is kind, (name, v)
    assert says in v.reason
    assert v.delay_s == 0


ATTEMPTS = [
    # name, result, shard, attempt, kind, delay, reason contains
    ("succeeded", AttemptResult("succeeded", 0), shard(), 1, K.SUCCEEDED, 0, ""),
    ("preempted (exit 75)", AttemptResult("preempted", 75), shard(), 1, K.PREEMPTED, 0, "preempted"),
    ("preempted on the last attempt", AttemptResult("preempted", 75), shard(), 5, K.PREEMPTED, 0, ""),
    ("died while the agent stopped it", AttemptResult("failed", -15, stopped=True), shard(), 1, K.PREEMPTED, 0,
     "stopped by the agent"),
    ("succeeded while stopping", AttemptResult("succeeded", 0, stopped=True), shard(), 1, K.SUCCEEDED, 0, ""),
    ("first failure retries after 2 s", AttemptResult("failed", 1), shard(), 1, K.RETRY, 2, "exited with code 1"),
    ("third failure: 8 s", AttemptResult("failed", 1), shard(), 3, K.RETRY, 8, ""),
    ("fifth attempt fails: poison", AttemptResult("failed", 1), shard(), 5, K.POISON, 0, "exited with code 1"),
    ("excused deliveries push the limit", AttemptResult("failed", 1), shard(preemptions=2), 5, K.RETRY, 32, ""),
    ("...up to the limit", AttemptResult("failed", 1), shard(preemptions=2), 7, K.POISON, 0, ""),
    ("unusable input (exit 65)", AttemptResult("failed", 65, permanent=True), shard(), 1, K.POISON, 0,
     "unusable input: not retried"),
    ("parameters rejected by the launcher", AttemptResult(error=InputRejected("bad r", field="r")), shard(), 1,
     K.POISON, 0, "rejected by the payload: bad r"),
    ("transient storage error", AttemptResult(error=TransientError("503", code="ServerBusy")), shard(), 1,
     K.RETRY, 2, "transient error around the run [ServerBusy]"),
    ("permanent storage error", AttemptResult(error=NotFound("input gone", code="BlobNotFound")), shard(), 2,
     K.RETRY, 2, "permanent error around the run [BlobNotFound]"),
]


@pytest.mark.parametrize("name, result, row, attempt, kind, delay, says", ATTEMPTS, ids=[a[0] for a in ATTEMPTS])
def test_decide_attempt_table(name, result, row, attempt, kind, delay, says):
    v = decide_attempt(result, row, attempt, CFG)
    assert (v.kind, v.delay_s) == (kind, delay), (name, v)
    assert says in v.reason, v.reason


def test_backoff_is_capped():
    cfg = AttemptConfig(max_failures=20, retry_backoff_s=2.0, max_backoff_s=60.0)
    delays = [decide_attempt(AttemptResult("failed", 1), shard(), n, cfg).delay_s for n in range(1, 12)]
    assert delays == [2, 4, 8, 16, 32, 60, 60, 60, 60, 60, 60]


def test_verdict_is_a_value():
    assert Verdict(K.RETRY, 2, "x") == Verdict(K.RETRY, 2, "x")


NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def job_as(status: str = "running", **fields) -> JobRow:
    return JobRow(job_id="j", status=status, **fields)


def running(*ids: str) -> list[tuple[str, str]]:
    """The job's running shards as the ledger lists them: (server write time, shard id), in start order."""
    return [(f"2026-12-01T11:00:{n:02d}Z", sid) for n, sid in enumerate(ids)]


GO_NO_GO = [
    # name, dequeue count, job, cap, running shards, kind, delay, reason contains
    ("cancelled job: a leftover message is cancelled", 1, job_as("cancelled"), 0, [], K.CANCELLED, 0, "cancelled"),
    ("poison wins over cancelled", 6, job_as("cancelled"), 0, [], K.POISON, 0, "5 times"),
    ("over budget wins over cancelled", 1, job_as("cancelled", budget_usd=1.0, spent_usd=2.0), 0, [], K.DROP, 0,
     "budget exceeded"),
    ("killed job: dropped", 1, job_as(killed_at="2026-12-01T11:59:00Z", killed_reason="killed by upwell kill"), 0,
     [], K.DROP, 0, "killed by upwell kill"),
    ("killed without a reason", 1, job_as(killed_at="2026-12-01T11:59:00Z"), 0, [], K.DROP, 0, "killed"),
    ("past its max wall-clock: dropped", 1,
     job_as(max_wall_clock_s=600, started_at="2026-12-01T11:00:00Z"), 0, [], K.DROP, 0,
     "ran 3600 s, past its max wall-clock of 600 s"),
    ("within its max wall-clock runs", 1,
     job_as(max_wall_clock_s=7200, started_at="2026-12-01T11:00:00Z"), 0, [], K.RUN, 0, ""),
    ("cancelled wins over the kill switch", 1, job_as("cancelled", killed_at="2026-12-01T11:59:00Z"), 0, [],
     K.CANCELLED, 0, ""),
    ("at its concurrency cap: deferred", 1, job_as(), 2, running("a", "b"), K.DEFER, 2, "concurrency cap (2)"),
    ("under its cap runs", 1, job_as(), 2, running("a"), K.RUN, 0, ""),
    ("its own running row does not count", 1, job_as(), 2, running("a", "s"), K.RUN, 0, ""),
    ("no cap: any number running", 1, job_as(), 0, running("a", "b", "c"), K.RUN, 0, ""),
    ("the kill switch wins over the cap", 1, job_as(killed_at="2026-12-01T11:59:00Z"), 1, running("a"), K.DROP, 0,
     ""),
]


@pytest.mark.parametrize("name, count, j, cap, active, kind, delay, says", GO_NO_GO, ids=[g[0] for g in GO_NO_GO])
def test_decide_delivery_go_no_go_table(name, count, j, cap, active, kind, delay, says):
    v = decide_delivery(decoded=True, result_exists=False, dequeue_count=count, shard=shard(), job=j, config=CFG,
                        now=NOW, cap=cap, active=active)
    assert (v.kind, v.delay_s) == (kind, delay), (name, v)
    assert says in v.reason, v.reason


CLAIMS = [
    # name, marked, cap, running shards after the mark, kind, reason contains
    ("marked, no cap: run", True, 0, [], K.RUN, ""),
    ("the row had ended: a duplicate", False, 0, [], K.DONE, "had ended"),
    ("the row had ended under a cap", False, 2, running("a", "b", "s"), K.DONE, ""),
    ("among the first by write time: run", True, 2, running("a", "s", "b"), K.RUN, ""),
    ("lost the race for the last slot: deferred", True, 2, running("a", "b", "s"), K.DEFER, "concurrency cap (2)"),
]


@pytest.mark.parametrize("name, marked, cap, active, kind, says", CLAIMS, ids=[c[0] for c in CLAIMS])
def test_decide_claim_table(name, marked, cap, active, kind, says):
    v = decide_claim(marked=marked, shard_id="s", config=CFG, cap=cap, active=active)
    assert v.kind is kind, (name, v)
    assert says in v.reason
    assert v.delay_s == (CFG.defer_s if kind is K.DEFER else 0)


def test_two_agents_that_raced_see_the_same_order():
    """Both passed the first check for the last slot; after both marks, exactly one of them backs off."""
    after = running("a", "s1", "s2")
    kinds = [decide_claim(marked=True, shard_id=sid, config=CFG, cap=2, active=after).kind for sid in ("s1", "s2")]
    assert kinds == [K.RUN, K.DEFER]


KILLED = job_as(max_shard_wall_clock_s=30)
ENDINGS = [
    # name, result, kind, delay, reason contains
    ("cancelled while it ran", AttemptResult("preempted", 75, cancelled=True), K.CANCELLED, 0, "cancelled"),
    ("cancelled, the payload died of the stop", AttemptResult("failed", -15, stopped=False, cancelled=True),
     K.CANCELLED, 0, ""),
    ("cancelled, but it succeeded first", AttemptResult("succeeded", 0, cancelled=True), K.SUCCEEDED, 0, ""),
    ("past its max wall-clock: dropped", AttemptResult("failed", -9, timed_out=True), K.DROP, 0,
     "past its max wall-clock of 30 s"),
    ("timed out but succeeded", AttemptResult("succeeded", 0, timed_out=True), K.SUCCEEDED, 0, ""),
    ("timed out and preempted: not a failure", AttemptResult("preempted", 75, stopped=True, timed_out=True),
     K.PREEMPTED, 0, ""),
    ("cancelled wins over timed out", AttemptResult("failed", -9, cancelled=True, timed_out=True), K.CANCELLED, 0,
     ""),
    ("an error wins over cancelled", AttemptResult(error=TransientError("503", code="ServerBusy"), cancelled=True),
     K.RETRY, 2, "transient"),
]


@pytest.mark.parametrize("name, result, kind, delay, says", ENDINGS, ids=[e[0] for e in ENDINGS])
def test_decide_attempt_endings_table(name, result, kind, delay, says):
    v = decide_attempt(result, shard(), 1, CFG, job=KILLED)
    assert (v.kind, v.delay_s) == (kind, delay), (name, v)
    assert says in v.reason, v.reason


@pytest.mark.parametrize("job_cap, setting, want", [(0, 0, 0), (3, 0, 3), (0, 4, 4), (3, 4, 3), (5, 2, 2)])
def test_concurrency_cap_is_the_lower_of_those_set(job_cap, setting, want):
    assert concurrency_cap(JobRow(max_concurrency=job_cap), setting) == want


def test_every_kind_has_a_rule():
    """Each VerdictKind is reached by at least one row of the tables above."""
    reached = {d[6] for d in DELIVERIES} | {a[4] for a in ATTEMPTS} | {g[5] for g in GO_NO_GO} | \
        {c[4] for c in CLAIMS} | {e[2] for e in ENDINGS}
    assert reached == set(VerdictKind)
