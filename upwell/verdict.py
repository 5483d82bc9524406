"""What becomes of a delivery and of an attempt: the only place that decides an attempt's fate.
Pure: no I/O, and no clock but the ``now`` it is given (the agent always gives one); the agent
gathers the facts once, asks here once, and acts on the Verdict.

Rules (DESIGN.md, "Semantics that must hold"), in the order they are tried:

Before an attempt (``decide_delivery``), then after marking the shard running (``decide_claim``):
- a message that cannot be decoded is poisoned at once, never retried;
- a shard whose result exists is done (a duplicate delivery only acknowledges), and so is one
  whose row had ended when the agent tried to mark it running;
- failures = dequeue_count - 1 - preemptions - deferrals; at ``max_failures`` the shard is poisoned;
- a job at or over its budget is no longer dispatched: its shards are dropped, not poisoned;
- a cancelled job (``upwell cancel``) is no longer dispatched: a leftover message is cancelled;
- a job killed or past its max wall-clock (the kill switch) is no longer dispatched: dropped;
- a shard whose node count is not the agent's (a gang agent of k nodes takes only shards of k nodes,
  a one-node agent only shards of one) is deferred the same way: another agent runs it, and it is
  never a failure;
- a job at its concurrency cap defers the shard: visible again after ``defer_s``, not a failure.
  Before the claim, ``cap`` other running shards defer it; after it, a shard that is not among the
  first ``cap`` by the server's write time backs off (two agents that raced see the same order).

After an attempt (``decide_attempt``):
- an error around the run (storage, staging) puts the message back after ``retry_backoff_s``:
  a transient one because it will pass, a permanent one because another node may not hit it
  (its delivery still counts towards ``max_failures``); parameters the launcher rejects poison;
- a job cancelled while its payload ran, unless the payload succeeded first: cancelled;
- an attempt past its max wall-clock that failed: dropped (the kill switch, not retried);
- a preemption (or a payload that died because the agent stopped it) is not a failure:
  visible again at once;
- exit 65 (unusable input) poisons at once;
- any other failure retries after ``retry_backoff_s * 2^(attempt-1)`` s (at most
  ``max_backoff_s``) until the attempt number reaches ``max_failures`` + the excused deliveries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from upwell.cost import wallclock
from upwell.errors import InputRejected, ShardSourceChanged, UpwellError
from upwell.rows import JobRow, JobState, ShardRow


class VerdictKind(StrEnum):
    RUN = "run"  # go ahead with the attempt
    DONE = "done"  # nothing to run: the result exists or the shard had ended (acknowledge only)
    SUCCEEDED = "succeeded"  # the attempt succeeded: write the result, acknowledge
    RETRY = "retry"  # visible again after delay_s; the failure counts
    PREEMPTED = "preempted"  # visible again at once; not a failure
    POISON = "poison"  # record the failure as the result, copy to -poison, acknowledge
    DROP = "drop"  # record the failure as the result (not poisoned), acknowledge
    CANCELLED = "cancelled"  # the job was cancelled: keep any checkpoint, mark the shard, acknowledge
    DEFER = "defer"  # at the job's cap, or another agent's shape: visible after delay_s; not a failure


@dataclass(frozen=True)
class Verdict:
    kind: VerdictKind
    delay_s: int = 0
    reason: str = ""


@dataclass(frozen=True)
class AttemptConfig:
    max_failures: int = 5  # host.json maxDequeueCount
    retry_backoff_s: float = 2.0
    max_backoff_s: float = 60.0
    defer_s: int = 2  # a shard whose job is at its concurrency cap waits this long (the agent adds jitter)


@dataclass(frozen=True)
class AttemptResult:
    """How an attempt ended, as the agent saw it.

    ``status`` is the launcher's (succeeded | failed | preempted); ``permanent``: the payload
    said its input is unusable (exit 65); ``stopped``: the agent had stopped the payload;
    ``error``: what was raised around the run (staging, the launcher refusing parameters);
    ``cancelled``: the job was cancelled while it ran; ``timed_out``: it ran past the shard's
    max wall-clock and was stopped."""

    status: str = "failed"
    exit_code: int | None = None
    permanent: bool = False
    stopped: bool = False
    error: UpwellError | None = None
    cancelled: bool = False
    timed_out: bool = False


def concurrency_cap(job: JobRow, setting: int) -> int:
    """Running shards allowed per job: the manifest's max_concurrency and the setting
    (UPWELL_MAX_CONCURRENCY), the lower of those set; 0 is no cap."""
    caps = [c for c in (job.max_concurrency, setting) if c > 0]
    return min(caps) if caps else 0


def decide_delivery(*, decoded: bool, result_exists: bool, dequeue_count: int, shard: ShardRow, job: JobRow,
                    config: AttemptConfig, now: datetime | None = None, cap: int = 0,
                    active: Sequence[tuple[str, str]] = (), nodes: int = 1, agent_nodes: int = 1) -> Verdict:
    """Before an attempt: run it, or settle the message without running. ``now``: when the facts were
    gathered (the job's wall-clock limit is judged against it; None reads the clock, for callers that
    judge nothing by time); ``cap``: concurrency_cap; ``active``:
    (server write time, shard id) of the job's running shards, read when there is a cap; ``nodes``: the
    shard's node count; ``agent_nodes``: the allocation's the agent serves (1, or a gang's k)."""
    if not decoded:
        return Verdict(VerdictKind.POISON, reason="the message cannot be decoded")
    if result_exists:
        return Verdict(VerdictKind.DONE, reason="duplicate: the result exists")
    failures = dequeue_count - 1 - shard.excused  # deliveries that ended without a clean outcome
    if failures >= config.max_failures:
        return Verdict(VerdictKind.POISON, reason=f"gave up: the worker died or failed {failures} times "
                                                  f"(maxDequeueCount {config.max_failures})")
    if job.over_budget:
        return Verdict(VerdictKind.DROP, reason=f"budget exceeded: spent ${job.spent_usd:.2f} of "
                                                f"${job.budget_usd:.2f}; the job is no longer dispatched")
    if job.status == JobState.CANCELLED:
        return Verdict(VerdictKind.CANCELLED, reason="the job was cancelled")
    overdue = wallclock.job_overdue(job, now)
    if overdue:
        return Verdict(VerdictKind.DROP, reason=overdue)
    if max(1, nodes) != max(1, agent_nodes):
        return Verdict(VerdictKind.DEFER, delay_s=config.defer_s,
                       reason=f"the shard runs on {max(1, nodes)} node(s); this agent's allocation has {agent_nodes}")
    if cap and sum(1 for _, sid in active if sid != shard.shard_id) >= cap:
        return _defer(cap, config)
    return Verdict(VerdictKind.RUN)


def decide_claim(*, marked: bool, shard_id: str, config: AttemptConfig, cap: int = 0,
                 active: Sequence[tuple[str, str]] = ()) -> Verdict:
    """After trying to mark the shard running: ``marked`` False means its row had ended (a duplicate);
    with a cap, ``active`` is read again after the mark, and a shard outside the first ``cap`` lost the
    race for the last slot."""
    if not marked:
        return Verdict(VerdictKind.DONE, reason="duplicate: the shard had ended")
    if cap and shard_id not in [sid for _, sid in sorted(active)[:cap]]:
        return _defer(cap, config)
    return Verdict(VerdictKind.RUN)


def decide_attempt(result: AttemptResult, shard: ShardRow, attempt: int, config: AttemptConfig,
                   job: JobRow | None = None) -> Verdict:
    """After an attempt: cancelled, dropped (past its wall-clock), succeeded, preempted, retry or poison.
    ``job``: the job row in hand (the wall-clock limit named in a drop)."""
    if result.error is not None:
        return _after_error(result.error, config)
    if result.cancelled and result.status != "succeeded":
        return Verdict(VerdictKind.CANCELLED, reason="the job was cancelled while the attempt ran")
    if result.timed_out and result.status == "failed":
        return Verdict(VerdictKind.DROP, reason=wallclock.shard_killed(job or JobRow()))
    if result.status == "preempted" or (result.status == "failed" and result.stopped):
        # A payload signalled before it could install its handler dies of the signal instead of
        # exiting 75: that is our preemption, not its failure (else a storm of evictions poisons).
        return Verdict(VerdictKind.PREEMPTED, reason="preempted" if result.status == "preempted"
                       else f"stopped by the agent (exit {result.exit_code})")
    if result.status == "succeeded":
        return Verdict(VerdictKind.SUCCEEDED)
    error = f"payload exited with code {result.exit_code}"
    if result.permanent:
        return Verdict(VerdictKind.POISON, reason=f"{error} (unusable input: not retried)")
    if attempt >= config.max_failures + shard.excused:
        return Verdict(VerdictKind.POISON, reason=error)
    delay = min(config.max_backoff_s, config.retry_backoff_s * 2 ** (attempt - 1))
    return Verdict(VerdictKind.RETRY, delay_s=int(delay), reason=error)


def _defer(cap: int, config: AttemptConfig) -> Verdict:
    return Verdict(VerdictKind.DEFER, delay_s=config.defer_s, reason=f"the job is at its concurrency cap ({cap})")


def _after_error(error: UpwellError, config: AttemptConfig) -> Verdict:
    if isinstance(error, ShardSourceChanged):  # the pinned bytes are gone: no attempt can run on them
        return Verdict(VerdictKind.POISON, reason=f"{type(error).__name__}: {error.message}")
    if isinstance(error, InputRejected):  # unregistered payload, bad parameters: retrying cannot help
        return Verdict(VerdictKind.POISON, reason=f"rejected by the payload: {error.message}")
    how = "permanent" if error.permanent else "transient"
    code = f" [{error.code}]" if error.code else ""
    return Verdict(VerdictKind.RETRY, delay_s=int(config.retry_backoff_s),
                   reason=f"{how} error around the run{code}: {str(error).splitlines()[0][:300] if str(error) else ''}")
