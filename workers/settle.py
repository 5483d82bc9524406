"""Acting on a verdict: each ``upwell.verdict.VerdictKind`` has one way to settle the message in hand.

Nothing here decides; it does what the verdict says, in the order that keeps "nothing lost":
- DONE: acknowledge only.
- SUCCEEDED: artifacts out (no checkpoint: nothing resumes a success), the result (conditional create),
  the concurrency slot released, then acknowledge.
- POISON, DROP: the failure recorded as the shard's result (collect counts it), a poison copy first,
  then acknowledge. An undecodable message has no result to write: it is only copied and acknowledged.
- CANCELLED: any checkpoint kept (a re-run resumes from it), the shard marked, acknowledge.
- PREEMPTED: checkpoint out, a preemption recorded, visible again at once.
- DEFER: a deferral recorded (not a failure), visible again after the delay and some jitter; one for
  another agent's shape (a gang's node count) says so (``SHAPE_DEFERRED``).
- RETRY: after a failed payload, the failure recorded and visible again after the backoff; after an
  error around the run, only visible again (the lease lapses on its own if that fails too).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from upwell.errors import UpwellError
from upwell.ledger import Ledger
from upwell.settings import Settings
from upwell.storage import Storage
from upwell.timeutil import now_iso, seconds_between
from upwell.verdict import Verdict, VerdictKind
from workers import results
from workers.delivery import Hand
from workers.node import Node
from workers.staging import Staging

SHAPE_DEFERRED = "deferred-shape"  # put back for an agent of the shard's node count: this one had no work
# The verdicts whose settling writes the shard row in hand into the result (its attempts, its stderr tail):
# on a row assumed from the work item (workers.delivery ``as_ingested``) they are settled only once the row
# has been read. The others settle on nothing of it: DONE acknowledges, and CANCELLED and DEFER change the
# row through the ledger, which reads it as it writes.
SETTLED_ON_ROW = frozenset({VerdictKind.POISON, VerdictKind.DROP})


class Settler:
    """State: none of its own; the agent's storage, ledger, staging, node and settings."""

    def __init__(self, storage: Storage, ledger: Ledger, staging: Staging, node: Node, *, poison_queue: str,
                 settings: Settings) -> None:
        self.storage, self.ledger, self.staging, self.node = storage, ledger, staging, node
        self.poison_queue, self.settings = poison_queue, settings
        self._acts = {VerdictKind.DONE: self._done, VerdictKind.SUCCEEDED: self._succeeded,
                      VerdictKind.POISON: self._give_up, VerdictKind.DROP: self._give_up,
                      VerdictKind.CANCELLED: self._cancelled, VerdictKind.PREEMPTED: self._preempted,
                      VerdictKind.DEFER: self._defer, VerdictKind.RETRY: self._retry}

    def act(self, hand: Hand, verdict: Verdict, result=None, input_path: Path | None = None,
            error: UpwellError | None = None) -> str:
        """Settle the message as ``verdict`` says; what happened, for tests and logs. ``result``: the
        attempt's LaunchResult, if one ran; ``error``: what was raised around the run, if anything."""
        if hand.item is None:
            return self._undecodable(hand, verdict)
        return self._acts[verdict.kind](hand, verdict, result, input_path, error)

    def _undecodable(self, hand: Hand, verdict: Verdict) -> str:
        self.storage.send(self.poison_queue, hand.msg.content)
        hand.lease.delete()
        hand.log.error("agent.undecodable", error=hand.decode_error, message_id=hand.msg.id, reason=verdict.reason)
        return "poisoned-undecodable"

    def _done(self, hand: Hand, verdict: Verdict, *_: Any) -> str:
        hand.lease.delete()
        hand.log.info("agent.duplicate", dequeue_count=hand.msg.dequeue_count)
        return "duplicate"

    def _succeeded(self, hand: Hand, verdict: Verdict, result, input_path: Path | None, _: Any) -> str:
        item, finished = hand.item, now_iso()
        # No checkpoint out: nothing resumes a success (a rerun of it starts fresh, upwell.lifecycle.rerun).
        artifacts = self.staging.stage_out(item, result.artifacts, result.checkpoint_dir.parent / "out")
        doc = results.document(item, "succeeded", shard=hand.shard, job=hand.job, node=self.node.describe(),
                               started=hand.started, finished=finished, launch=result, input_path=input_path,
                               cpu_wait_s=cpu_wait(hand, result), artifacts=artifacts, settings=self.settings)
        self._write(hand, doc)
        hand.lease.delete()
        hand.log.info("agent.succeeded", run_s=round(result.run_s, 3))
        return "succeeded"

    def _give_up(self, hand: Hand, verdict: Verdict, result, *_: Any) -> str:
        """POISON or DROP: record the failure as the shard's result (collect counts it), then acknowledge."""
        item, poison = hand.item, verdict.kind is VerdictKind.POISON
        tail = getattr(result, "stderr_tail", "") or ""
        doc = results.document(item, "failed", shard=hand.shard, job=hand.job, node=self.node.describe(),
                               started=hand.started, finished=now_iso(), launch=result, error=verdict.reason,
                               cpu_wait_s=cpu_wait(hand, result), stderr_tail=tail or hand.shard.stderr_tail,
                               settings=self.settings)
        doc["poisoned"] = poison
        if poison:
            # Before the result: once the result exists, a redelivery only acks, so a crash between
            # the two would lose the poison copy. This order can at worst send it twice.
            self.storage.send(self.poison_queue, hand.msg.content)
        self._write(hand, doc)
        hand.lease.delete()
        hand.log.error("agent.poisoned" if poison else "agent.dropped", error=verdict.reason)
        return "poisoned" if poison else "dropped"

    def _write(self, hand: Hand, doc: dict) -> None:
        """The result, then (under a concurrency cap) the shard's slot released before collect runs;
        without a cap, the result carries the row as this agent left it (results.note_row)."""
        item = hand.item
        if not hand.cap:
            results.note_row(doc, hand.seen_row())
        results.write(self.storage.for_project(item.project), item, doc)
        if hand.cap:
            self.ledger.shard_released(item.job_id, item.shard_id)

    def _cancelled(self, hand: Hand, verdict: Verdict, result, *_: Any) -> str:
        """Keep any checkpoint (a re-run resumes from it), mark the shard, drop the message."""
        n = self.staging.checkpoint_out(hand.item, getattr(result, "checkpoint_dir", None))
        self.ledger.shard_cancelled(hand.item.job_id, hand.item.shard_id, checkpoints=n)
        hand.lease.delete()
        hand.log.info("agent.cancelled", checkpoint_files=n)
        return "cancelled"

    def _preempted(self, hand: Hand, verdict: Verdict, result, *_: Any) -> str:
        item, spent = hand.item, node_seconds(hand, result)
        if result.status != "preempted":
            hand.log.info("agent.stopped_payload_died", exit_code=result.exit_code)
        n = self.staging.checkpoint_out(item, result.checkpoint_dir)
        self.ledger.shard_preempted(item.job_id, item.shard_id, checkpoints=n, node_seconds=spent)
        hand.lease.release(verdict.delay_s)
        hand.log.info("agent.preempted", checkpoint_files=n, exit_code=result.exit_code)
        return "preempted"

    def _defer(self, hand: Hand, verdict: Verdict, *_: Any) -> str:
        """Put the message back for a short while; a deferral is not a failure (ShardRow.excused). The
        jitter keeps the agents that deferred together from coming back together."""
        item = hand.item
        self.ledger.shard_deferred(item.job_id, item.shard_id, node=self.node.id if hand.claimed else "")
        hand.lease.release(verdict.delay_s + random.randint(0, verdict.delay_s))
        hand.log.info("agent.deferred", max_concurrency=hand.cap, reason=verdict.reason)
        # Another agent's shape is not work for this one (workers.leasing: it may still leave when idle).
        return "deferred" if max(1, int(item.nodes)) == hand.agent_nodes else SHAPE_DEFERRED

    def _retry(self, hand: Hand, verdict: Verdict, result, _: Any, error: UpwellError | None) -> str:
        item = hand.item
        if error is not None:  # staging, the launcher refusing the parameters, storage
            hand.log.warning("agent.transient", error=verdict.reason, code=error.code)
            try:
                hand.lease.release(verdict.delay_s)
            except UpwellError:
                pass  # the lease lapses on its own: the message comes back all the same
            return "transient"
        self.ledger.shard_retry(item.job_id, item.shard_id, error=verdict.reason, stderr_tail=result.stderr_tail,
                                node_seconds=node_seconds(hand, result))
        hand.lease.release(verdict.delay_s)
        hand.log.warning("agent.failed_will_retry", exit_code=result.exit_code, attempt=item.attempt)
        return "retry"


def cpu_wait(hand: Hand, result) -> float:
    """The time this attempt waited for a CPU, its payload's and its staging's, as the node clock counted
    them (workers.supervision): not node time. A node of its own counts none."""
    return round(hand.staging_wait_s + float(getattr(result, "cpu_wait_s", 0.0) or 0.0), 3)


def node_seconds(hand: Hand, result) -> float:
    """The attempt's node time: its wall time less its CPU wait, times the nodes it held (a gang's)."""
    nodes = max(int(getattr(hand.item, "nodes", 1) or 1), 1)
    return max(0.0, (seconds_between(hand.started, now_iso()) or result.run_s) - cpu_wait(hand, result)) * nodes
