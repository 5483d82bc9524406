"""What becomes of a delivery and of an attempt: the only place that decides run, done,
retry, preempted, poison or drop. Pure: no I/O, no clock; the agent acts on the Verdict.

Rules (DESIGN.md, "Semantics that must hold"):
- a message that cannot be decoded is poisoned at once, never retried;
- a shard whose result exists is done (a duplicate delivery only acknowledges);
- failures = dequeue_count - 1 - preemptions - deferrals; at ``max_failures`` the shard is poisoned;
- a job at or over its budget is no longer dispatched: its shards are dropped, not poisoned;
- a preemption (or a payload that died because the agent stopped it) is not a failure:
  visible again at once;
- exit 65 (unusable input) and parameters the launcher rejects poison at once;
- any other failure retries after ``retry_backoff_s * 2^(attempt-1)`` s (at most
  ``max_backoff_s``) until the attempt number reaches ``max_failures`` + the excused deliveries;
- an error around the run (storage, staging) puts the message back after ``retry_backoff_s``:
  a transient one because it will pass, a permanent one because another node may not hit it
  (its delivery still counts towards ``max_failures``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from upwell.errors import InputRejected, UpwellError
from upwell.rows import JobRow, ShardRow


class VerdictKind(StrEnum):
    RUN = "run"  # go ahead with the attempt
    DONE = "done"  # nothing to run: the result exists (acknowledge only)
    SUCCEEDED = "succeeded"  # the attempt succeeded: write the result, acknowledge
    RETRY = "retry"  # visible again after delay_s; the failure counts
    PREEMPTED = "preempted"  # visible again at once; not a failure
    POISON = "poison"  # record the failure as the result, copy to -poison, acknowledge
    DROP = "drop"  # record the failure as the result (not poisoned), acknowledge


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


@dataclass(frozen=True)
class AttemptResult:
    """How an attempt ended, as the agent saw it.

    ``status`` is the launcher's (succeeded | failed | preempted); ``permanent``: the payload
    said its input is unusable (exit 65); ``stopped``: the agent had stopped the payload;
    ``error``: what was raised around the run (staging, the launcher refusing parameters)."""

    status: str = "failed"
    exit_code: int | None = None
    permanent: bool = False
    stopped: bool = False
    error: UpwellError | None = None


def decide_delivery(*, decoded: bool, result_exists: bool, dequeue_count: int, shard: ShardRow, job: JobRow,
                    config: AttemptConfig) -> Verdict:
    """Before an attempt: run it, or settle the message without running."""
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
    return Verdict(VerdictKind.RUN)


def decide_attempt(result: AttemptResult, shard: ShardRow, attempt: int, config: AttemptConfig) -> Verdict:
    """After an attempt: succeeded, preempted, retry or poison."""
    if result.error is not None:
        return _after_error(result.error, config)
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


def _after_error(error: UpwellError, config: AttemptConfig) -> Verdict:
    if isinstance(error, InputRejected):  # unregistered payload, bad parameters: retrying cannot help
        return Verdict(VerdictKind.POISON, reason=f"rejected by the payload: {error.message}")
    how = "permanent" if error.permanent else "transient"
    code = f" [{error.code}]" if error.code else ""
    return Verdict(VerdictKind.RETRY, delay_s=int(config.retry_backoff_s),
                   reason=f"{how} error around the run{code}: {str(error).splitlines()[0][:300] if str(error) else ''}")
