"""The per-job concurrency cap's order of claims on Azurite (upwell.ledger.active_shards, verdict.decide_claim).

A claim's place is the server's write time of the claim. A duplicate delivery of a shard that is still
running (its lease lapsed while another agent ran it) writes that running row again, by a deferral or a
re-claim; the row's write time then moves past newer claims, and without a pinned place a newer claim
would count itself inside the cap while the first still runs: three running under a cap of two."""

from __future__ import annotations

import time
import uuid

from upwell.ledger import JobRow, JobState, Ledger, ShardRow, ShardState
from upwell.verdict import AttemptConfig, VerdictKind, decide_claim

CAP = 2


def _claim(ledger: Ledger, job_id: str, shard_id: str, node: str, attempt: int = 1) -> VerdictKind:
    """What an agent does: mark the shard running, read the running shards again, judge its place."""
    assert ledger.shard_started(job_id, shard_id, node=node, pool="cpu", attempt=attempt)
    time.sleep(0.01)  # distinct server times on Azurite's millisecond clock
    return decide_claim(marked=True, shard_id=shard_id, config=AttemptConfig(), cap=CAP,
                        active=ledger.active_shards(job_id)).kind


def test_a_duplicate_delivery_never_moves_a_running_claim_behind_newer_ones(store):
    ledger = Ledger(store)
    job_id = f"cap-{uuid.uuid4().hex[:10]}"
    ledger.create_job(JobRow(job_id=job_id, status=JobState.RUNNING, pool="cpu", shards_total=4,
                             max_concurrency=CAP, created_at="2099-01-01"))
    ledger.add_shards(job_id, [ShardRow(job_id=job_id, shard_id=f"s{i}", pool="cpu") for i in range(4)])
    assert _claim(ledger, job_id, "s0", "n1") is VerdictKind.RUN
    assert _claim(ledger, job_id, "s1", "n2") is VerdictKind.RUN

    # s0's message comes back while n1 still runs it: n3 finds the job at its cap and defers the delivery,
    # a write on s0's running row. s0 keeps the first place, so the newcomer s2 is still the third.
    before = ledger.shard(job_id, "s0")
    ledger.shard_deferred(job_id, "s0", node="")
    after = ledger.shard(job_id, "s0")
    assert after.status == ShardState.RUNNING and after.node == "n1" and after.deferrals == 1
    assert after.written > before.written and after.claim_key == before.written
    assert _claim(ledger, job_id, "s2", "n4") is VerdictKind.DEFER
    ledger.shard_deferred(job_id, "s2", node="n4")
    assert ledger.shard(job_id, "s2").status == ShardState.QUEUED

    # Another duplicate of s1 is re-claimed by n5: s1 keeps its place too, and s3 is still outside the cap.
    assert _claim(ledger, job_id, "s1", "n5", attempt=2) is VerdictKind.RUN
    assert ledger.shard(job_id, "s1").claim_key
    assert _claim(ledger, job_id, "s3", "n6") is VerdictKind.DEFER
    ledger.shard_deferred(job_id, "s3", node="n6")
    assert [sid for _, sid in sorted(ledger.active_shards(job_id))] == ["s0", "s1"]

    # Once s0's agent releases it, the next claim takes its slot, and a new claim's place is its own write.
    ledger.shard_released(job_id, "s0")
    assert _claim(ledger, job_id, "s2", "n4", attempt=2) is VerdictKind.RUN
    assert not ledger.shard(job_id, "s2").claim_key
