"""decide_delivery and decide_attempt: every rule of an attempt's fate, table-driven."""

from __future__ import annotations

import pytest

from upwell.errors import InputRejected, NotFound, TransientError
from upwell.rows import JobRow, ShardRow
from upwell.verdict import (
    AttemptConfig,
    AttemptResult,
    Verdict,
    VerdictKind,
    decide_attempt,
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
