"""Issue 23, acceptance g: a cancel reaches a running shard within one lease-renewal poll.

A real agent (workers.agent.Agent, its lease loop in a thread of this process so that its ticks can be
watched) runs a shard of a long logistic job on a fresh Azurite; ``upwell cancel``'s code
(upwell.lifecycle.cancel) cancels the job. The launcher's tick renews the lease and then asks the job row
(workers.supervision.CancelWatch); the agent's copies of job rows live ``JOB_ROW_TTL_S`` here, far longer
than a tick, so only a fresh read (at most CANCEL_MAX_AGE_S old) can see the cancel in time. The first tick
after the cancel is written must see it and stop the payload: counted in ticks, not seconds. Nothing is
lost: every shard ends cancelled, no message stays behind (visible or leased), no payload process is left.
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.faults import harness
from upwell import names
from upwell.ingest.ingestor import Ingestor
from upwell.ledger import Ledger
from upwell.lifecycle.cancel import cancel_job
from upwell.settings import Settings
from workers import supervision
from workers.agent import Agent
from workers.agent_config import AgentConfig

pytestmark = pytest.mark.cloudfaults
SHARDS = 3
JOB_ROW_TTL_S = 600.0  # the agent's job-row cache: a tick that used it would miss the cancel


class StampedLedger(Ledger):
    """The ledger that ``cancel_job`` writes through; notes when the job row said "cancelled"."""

    written_at = 0.0

    def change_job(self, job_id, change):
        fields = super().change_job(job_id, change)
        self.written_at = time.monotonic()
        return fields


def test_cancel_reaches_the_running_shard_at_the_next_renewal_poll(stack, monkeypatch):
    store, ledger = stack.storage, Ledger(stack.storage)
    blob = "cloudfaults/cancel/job.yaml"
    store.blob(names.INCOMING, blob).upload_blob(harness.sweep("cancel", SHARDS, sleep_s=300), overwrite=True)
    settings = Settings.from_env(stack.env)
    job_id = Ingestor(store, settings).ingest(blob).job_id
    ticks: list[tuple[float, bool]] = []  # (when a tick asked the job row, whether it saw the cancel)
    real_check = supervision.CancelWatch.check
    monkeypatch.setattr(supervision.CancelWatch, "check",
                        lambda watch: ticks.append((time.monotonic(), real_check(watch))) or ticks[-1][1])
    config = AgentConfig(pool="cpu", node_id="cancel-node", scratch=str(stack.scratch), poll_s=0.2, lease_s=30,
                         idle_exit_s=3, job_row_ttl_s=JOB_ROW_TTL_S, max_items=SHARDS)
    agent = Agent(store, config, settings)
    with harness.recorded("cancel a running shard", shards=SHARDS) as counts:
        runner = threading.Thread(target=agent.run, daemon=True)
        runner.start()
        try:
            running = harness.wait_until(lambda: [s for s in ledger.shards(job_id) if s.status == "running"], 60,
                                         "the agent to run a shard")
            harness.wait_until(lambda: any(not seen for _, seen in ticks), 30, "a renewal poll before the cancel")
            stamped = StampedLedger(store)
            outcome = cancel_job(store, job_id, wait_s=60, ledger=stamped)
        finally:
            runner.join(60)
            agent.stop.set()
        after = [seen for at, seen in ticks if at >= stamped.written_at]
        assert after and after[0], (ticks, stamped.written_at)  # the first poll after the cancel saw it
        assert (outcome.running, outcome.still_running) == (1, 0), outcome
        rows = {s.shard_id: s for s in ledger.shards(job_id)}
        assert rows[running[0].shard_id].status == "cancelled" and not rows[running[0].shard_id].failures
        counts.lost = sum(r.status != "cancelled" for r in rows.values())
        harness.wait_until(lambda: harness.queue_count(store, names.work_queue("cpu")) == 0, 30,
                           "no message left, visible or leased")
        harness.wait_until(lambda: not harness.payload_pids(stack.scratch), 20, "the payload process to exit")
        assert not runner.is_alive(), "the agent did not go idle"
    assert counts.lost == 0
