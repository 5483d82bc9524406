"""The worker agent: the container entrypoint (`python -m workers.agent --pool cpu`).

One message, top-down, as the flow in docs/architecture.md draws it: receive (``workers.leasing``) ->
gather the facts once (``workers.delivery``) -> decide once (``upwell.verdict``) -> stage in
(``workers.staging``) -> run the payload (``workers.launch``, under ``workers.supervision``: signals,
cancel, the node clock) -> checkpoint -> stage out -> ack, each outcome acted on by ``workers.settle``
and recorded as a result (``workers.results``). The agent keeps no state beyond the messages in hand
and short-lived copies of job rows (``workers.jobrows``); the queue and the ledger hold the rest.

Slots: up to ``slots`` work items at once (the pool's tasks per node, UPWELL_SLOTS; default 1), each
with its own lease renewal. SIGTERM/SIGINT preempt every running payload, which checkpoints; its
message is made visible again at once and a preemption, not a failure, is recorded. On an Azure node a
Scheduled Event that takes this VM down (Preempt, Terminate, a due Reboot or Redeploy) does the same
(``workers.eviction``), and is acknowledged once the loop has returned; the agent then takes no work until
the event has left the document (a VM back from a Reboot or Redeploy gets its agent back). SIGUSR1 drains.
The agent also exits after ``idle_exit_s`` without work.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from pathlib import Path

from upwell import logs, names
from upwell.cost import wallclock
from upwell.errors import UpwellError
from upwell.ledger import JobState, Ledger
from upwell.payloads.registry import Registry
from upwell.settings import Settings, env_float
from upwell.storage import Storage
from upwell.timeutil import now_iso
from upwell.verdict import (
    AttemptConfig,
    AttemptResult,
    Verdict,
    VerdictKind,
    decide_attempt,
    decide_claim,
    decide_delivery,
)
from workers import blocks, eviction
from workers.agent_config import AgentConfig
from workers.delivery import Hand, gather
from workers.jobrows import JobRows
from workers.leasing import LeaseLoop
from workers.node import Node, heartbeat
from workers.settle import SETTLED_ON_ROW, Settler
from workers.staging import Staging, may_resume
from workers.supervision import CancelWatch, install_signals, node_clock
from workers.workdir import LaunchResult


class Agent:
    """Runs work items from one pool's queue until stopped, drained or idle. State: the stop and drain
    events, and the parts it wires together once (the loop, node, staging, settler, node clock)."""

    def __init__(self, storage: Storage, config: AgentConfig, settings: Settings | None = None):
        self.storage, self.config = storage, config
        self.settings = settings or Settings.from_env()
        self.ledger = Ledger(storage)
        self.jobs = JobRows(self.ledger.job, config.job_row_ttl_s)
        self.definitions = Registry(storage, self.settings.registry_allowlist)
        self.attempts = AttemptConfig(max_failures=config.max_dequeue_count, retry_backoff_s=config.retry_backoff_s,
                                      defer_s=config.defer_s)
        self.stop = threading.Event()  # preempt now
        self.drain = threading.Event()  # finish the item in hand, then exit
        self.quit = threading.Event()  # a signal asked the agent to end (ends a wait for a reboot to be over)
        self.log = logs.get("upwell.agent", pool=config.pool, node=config.node_id)
        self.clock = node_clock(config.shared_machine)  # chosen once: what of wall time is node time
        self.node = Node(config.node_id, config.pool, vm_size=config.vm_size, spot=config.spot,
                         state_file=config.state_file, slots=config.slots,
                         heartbeat=heartbeat(storage, config, self.log))
        queue_name = names.work_queue(config.pool)
        self.loop = LeaseLoop(storage, queue_name, config, self.node, stop=self.stop, drain=self.drain, log=self.log)
        self.queue = self.loop.queue
        self.staging = Staging(storage, config.scratch, self.log)
        self.settle = Settler(storage, self.ledger, self.staging, self.node,
                              poison_queue=names.poison_queue(queue_name), settings=self.settings)

    @property
    def processed(self) -> int:
        return self.loop.processed

    def run(self) -> int:
        """Receive and handle work items until stopped, drained, idle for ``idle_exit_s`` or at ``max_items``;
        on an Azure node, through the VM's reboots (``workers.eviction.watched``)."""
        return eviction.watched(lambda: self.loop.run(self.handle), self.config, self.stop, self.quit, log=self.log,
                                waiting=self.node.maintenance)

    def handle(self, msg) -> str:
        """One message: gather the facts once, decide once, then act; returns what happened (tests, logs)."""
        lease = self.loop.lease(msg)
        hand, verdict = self._decide(msg, lease, assume=True)
        if verdict is None:  # the shard row was not as the work item says ingest wrote it: read it, decide again
            hand, verdict = self._decide(msg, lease, assume=False)
        if verdict.kind is not VerdictKind.RUN:
            return self.settle.act(hand, verdict)
        with self.node.holding(msg.id, f"{hand.item.job_id}/{hand.item.shard_id}"):
            return self._attempt(hand)

    def _decide(self, msg, lease, *, assume: bool) -> tuple[Hand, Verdict | None]:
        """Gather the facts (``assume``: the shard row as the work item says ingest wrote it, where it can,
        workers.delivery), decide, and claim a shard that is to run. None: the facts were assumed, and the
        claim found the row changed, or the verdict puts the row into the result (``SETTLED_ON_ROW``: read it
        first). A first delivery's verdict does not hang on the row (no failure of it to count yet)."""
        hand = gather(msg, lease, storage=self.storage, ledger=self.ledger, jobs=self.jobs, assume=assume,
                      max_concurrency=self.settings.max_concurrency, log=self.log, agent_nodes=self.config.gang_nodes)
        verdict = decide_delivery(**hand.facts(), config=self.attempts)
        if verdict.kind is VerdictKind.RUN:
            return hand, self._claim(hand)
        return hand, None if hand.assumed and verdict.kind in SETTLED_ON_ROW else verdict

    def _claim(self, hand: Hand) -> Verdict | None:
        """Mark the shard running on the rows in hand (no re-read unless one moved on; on rows assumed from
        the work item, one write If-Match the row's ETag and nothing else: None when it had moved on); under
        a cap, read the running shards again for the race for the last slot."""
        item, attempt = hand.item, hand.msg.dequeue_count
        etag = self.ledger.shard_started(item.job_id, item.shard_id, node=self.node.id, pool=self.node.pool,
                                         attempt=attempt, spot=self.node.spot, row=hand.shard, job=hand.job,
                                         seen_only=hand.assumed)
        if etag is None:  # cancelled, re-driven, claimed by a twin delivery since ingest wrote it: read it
            hand.log.info("agent.row_moved_on", row_etag=hand.shard.etag)
            return None
        if etag:
            hand.etag, hand.claimed = ("" if etag == "?" else etag), True
            if hand.job.status != JobState.RUNNING:  # the job has just been marked running: the copy is out of date
                self.jobs.forget(item.job_id)
        active = self.ledger.active_shards(item.job_id) if etag and hand.cap else []
        verdict = decide_claim(marked=bool(etag), shard_id=item.shard_id, config=self.attempts, cap=hand.cap,
                               active=active)
        if verdict.kind is VerdictKind.RUN:
            hand.item = item.with_attempt(attempt)
        return verdict

    def _attempt(self, hand: Hand) -> str:
        """stage in -> run payload -> (as decide_attempt rules) checkpoint -> stage out -> ack."""
        hand.started = now_iso()
        with self.staging.workdir(hand.item.shard_id) as root:
            try:
                input_path, resume = self._stage_in(hand, root)
                result, ended = self._run_payload(hand, root, input_path, resume)
                verdict = decide_attempt(ended, hand.shard, hand.item.attempt, self.attempts, job=hand.job)
                return self.settle.act(hand, verdict, result, input_path)
            except UpwellError as exc:  # staging, the launcher refusing the parameters, storage
                verdict = decide_attempt(AttemptResult(error=exc), hand.shard, hand.item.attempt, self.attempts)
                return self.settle.act(hand, verdict, error=exc)

    def _stage_in(self, hand: Hand, root: Path) -> tuple[Path | None, Path | None]:
        """The input and (unless this is the shard's first attempt) the kept checkpoint; the node clock
        counts how long this slot's thread waited for a CPU meanwhile."""
        item, waited = hand.item, self.clock.thread_waited()
        input_path = self.staging.stage_in(item, root)
        resume = self.staging.checkpoint_in(item, root) if may_resume(hand.shard, hand.etag) else None
        hand.staging_wait_s = self.clock.thread_waited() - waited
        hand.lease.renew()  # a slow claim and stage-in must not let the message reappear before the payload ticks
        hand.log.info("agent.run", attempt=item.attempt, resume=bool(resume), payload=item.payload)
        return input_path, resume

    def _run_payload(self, hand: Hand, root: Path, input_path: Path | None,
                     resume: Path | None) -> tuple[LaunchResult, AttemptResult]:
        """Run the payload, renewing the lease and watching for a cancel; keep its log; how it ended."""
        item, watch = hand.item, CancelWatch(self.ledger, hand.item.job_id, self.stop, rows=self.jobs)
        launch = blocks.launcher(item, self.staging)  # a block's points run in turn, each as one item would
        result = launch(item, root / "work", input_path=input_path, resume_dir=resume, stop=watch,
                        on_tick=watch.ticker(self.node.ticking(hand.lease.renew)), ranks=self.config.ranks or None,
                        definitions=self.definitions, timeout_s=wallclock.shard_timeout(hand.job),
                        clock=self.clock, apptainer=self.config.apptainer)
        self.staging.keep_log(item, result, earlier=may_resume(hand.shard, hand.etag))  # an earlier log?
        ended = AttemptResult(status=result.status, exit_code=result.exit_code, permanent=result.permanent,
                              stopped=self.stop.is_set(), cancelled=watch.cancelled.is_set(),
                              timed_out=result.timed_out)
        if result.status == "preempted" and self.config.gang_nodes > 1:
            self.stop.set()  # Slurm signalled the gang's ranks (scancel, a time limit): the allocation is going
        return result, ended


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="workers.agent", description=__doc__.splitlines()[0])
    parser.add_argument("--pool", default=os.environ.get("UPWELL_POOL", "cpu"))
    parser.add_argument("--idle-exit", type=float, default=env_float(os.environ, "UPWELL_IDLE_EXIT_S", 0.0))
    parser.add_argument("--lease", type=int, default=None)
    parser.add_argument("--max-items", type=int, default=0)
    args = parser.parse_args(argv)
    logs.configure()
    eviction.imds_direct(os.environ)  # before any credential asks IMDS for a token
    config = AgentConfig.from_env(args.pool, idle_exit_s=args.idle_exit, lease_s=args.lease, max_items=args.max_items)
    agent = Agent(Storage(), config)
    install_signals(agent.stop, agent.drain, agent.quit)
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
