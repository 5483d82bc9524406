"""Fault injection through the real pipeline: nothing is lost, nothing is counted twice.

Each test runs a job of tiny logistic shards (the devhost drives the real
function_app on a fresh Azurite; the scale timer spawns local agents) while it
injects one fault, then ``harness.verify`` checks the whole contract and
``harness.no_orphans`` that no process is left behind. The counts of every
fault are printed in a table at the end of the session ("lost = 0").

A fault that strikes at random moments for as long as the job runs (SIGKILL, SIGTERM) gets ``SHARDS``, so
that it meets enough work to strike often; a fault that strikes once, or per message, gets ``FEW``: its
guarantee (each shard counted once, nothing lost) does not grow with the shard count, only the run time does.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time

from tests.faults import harness
from tests.pipeline_helpers import live_worker_pids
from upwell import names
from upwell.ledger import Ledger
from upwell.timeutil import now_iso

SHARDS = 60  # the random-moment faults: each must strike at least 5 times
STORM_SHARDS = 100  # a SIGTERM storm preempts only the shards running when it strikes: it needs the longer job
FEW = 40  # the one-shot and per-message faults


class Injector(threading.Thread):
    """Calls ``strike(rng)`` at seeded random intervals until stopped; counts what it did."""

    def __init__(self, seed: int, strike, low: float, high: float, limit: int = 25):
        super().__init__(daemon=True)
        self.rng, self.strike, self.low, self.high, self.limit = random.Random(seed), strike, low, high, limit
        self.done = threading.Event()
        self.hits = 0

    def run(self) -> None:
        while self.hits < self.limit and not self.done.wait(self.rng.uniform(self.low, self.high)):
            self.hits += self.strike(self.rng)

    def stop(self) -> int:
        self.done.set()
        self.join(10)
        return self.hits


def signal_worker(stack: harness.Stack, signum: int, everyone: bool = False):
    def strike(rng: random.Random) -> int:
        pids = sorted(live_worker_pids(stack.state_dir))
        if not pids:
            return 0
        victims = pids if everyone and rng.random() < 0.2 else [rng.choice(pids)]
        hit = 0
        for pid in victims:
            try:
                os.kill(pid, signum)
                hit += 1
            except ProcessLookupError:
                pass
        return hit
    return strike


def test_workers_killed_at_random_moments(stack):
    """SIGKILL agents at seeded random moments: their leases lapse and the shards run again."""
    with harness.recorded("SIGKILL workers", shards=SHARDS) as counts:
        with harness.in_process_host(stack):
            job_id = harness.upload(stack.storage, "faults/kill/job.yaml", harness.sweep("kill", SHARDS))
            harness.wait_progress(stack.storage, job_id, 1)
            killer = Injector(1, signal_worker(stack, signal.SIGKILL), 0.3, 1.2)
            killer.start()
            harness.wait_progress(stack.storage, job_id, SHARDS * 3 // 4, timeout=180)
            counts.kills = killer.stop()
            harness.verify(stack, job_id, counts)
        harness.no_orphans(stack)
        assert counts.kills >= 5


def test_duplicated_messages(stack):
    """Copies of work items (some while the originals run, some after the job is done), a second
    report message and a second delivery of the upload: each shard still counts once, one report."""
    from azure.storage.blob import BlobClient

    from upwell.local.devhost.app import load_functions

    with harness.recorded("duplicate deliveries", shards=FEW) as counts:
        storage = stack.storage
        work = storage.queue(names.work_queue("cpu"))
        with harness.in_process_host(stack):
            manifest = harness.sweep("dup", FEW)
            job_id = harness.upload(storage, "faults/dup/job.yaml", manifest)
            copies = harness.wait_until(lambda: [m.content for m in work.peek_messages(max_messages=32)][10:], 30,
                                        "work items to copy")
            rng = random.Random(2)
            for text in rng.sample(copies, min(30, len(copies))):
                work.send_message(text)
                counts.duplicates += 1
            harness.wait_reported(storage, job_id)
            for text in rng.sample(copies, min(10, len(copies))):  # late copies of shards that are long done
                work.send_message(text)
                counts.duplicates += 1
            storage.queue(names.REPORT_QUEUE).send_message(json.dumps({"job_id": job_id}))
            ingest = {s.name: s for s in load_functions("function_app:app")}["ingest"].func
            ingest(BlobClient.from_connection_string(stack.azurite.connection_string, names.INCOMING,
                                                     "faults/dup/job.yaml"))
            counts.duplicates += 2
            harness.verify(stack, job_id, counts)
        harness.no_orphans(stack)


def test_transient_failures_succeed_on_retry(stack):
    """A payload that fails its first one or two attempts: retried with backoff, then it succeeds."""
    with harness.recorded("transient failures", shards=FEW) as counts:
        grid = {"r": harness.r_values(FEW // 4), "fail_first_attempts": [0, 0, 1, 2]}
        with harness.in_process_host(stack):
            job_id = harness.upload(stack.storage, "faults/transient/job.yaml",
                                    harness.sweep("transient", grid=grid))
            harness.verify(stack, job_id, counts)
        for row in Ledger(stack.storage).shards(job_id):
            sid, want = row.shard_id, json.loads(row.params)["fail_first_attempts"]
            assert int(row.failures or 0) == want, (sid, row.failures, want)
            doc = json.loads(stack.storage.read(f"{names.RESULTS}/{job_id}/{sid}.json"))
            # The attempt number reached the payload (through item.json), which failed until it passed want.
            assert doc["metrics"]["attempt"] == doc["timings"]["attempt"] > want, (sid, doc["timings"])
        assert counts.retries == FEW // 4 * 3
        harness.no_orphans(stack)


def test_poison_payload_reaches_poison_queue(stack, monkeypatch):
    """A payload that always fails: after maxDequeueCount attempts its message moves to the -poison
    queue, a failed result is written so collect counts it, and the job ends partially failed."""
    with harness.recorded("poison payload", shards=FEW) as counts:
        grid = {"r": harness.r_values(FEW // 10), "fail_first_attempts": [0] * 9 + [100]}
        monkeypatch.setenv("UPWELL_RETRY_BACKOFF_S", "0.5")  # retries after 0, 1, 2 and 4 s
        with harness.in_process_host(stack):
            job_id = harness.upload(stack.storage, "faults/poison/job.yaml", harness.sweep("poison", grid=grid))
            harness.wait_progress(stack.storage, job_id, 1)
            poisoned = {r.shard_id for r in Ledger(stack.storage).shards(job_id)
                        if json.loads(r.params)["fail_first_attempts"] == 100}
            assert len(poisoned) == FEW // 10
            harness.verify(stack, job_id, counts, poisoned=poisoned)
        for row in Ledger(stack.storage).shards(job_id):
            if row.shard_id in poisoned:
                assert "exited with code 1" in row.error and "injected failure" in row.stderr_tail
                assert int(row.failures) == 4  # the fifth failure poisons instead of retrying
        report = stack.storage.read(f"{names.REPORTS}/{job_id}/index.html").decode()
        assert all(s in report for s in poisoned)
        harness.no_orphans(stack)


def test_azurite_stopped_and_restarted(stack):
    """Storage goes away mid-run for a few seconds (on-disk persistence) and comes back on the same ports."""
    with harness.recorded("Azurite restarts", shards=FEW) as counts:
        with harness.in_process_host(stack):
            job_id = harness.upload(stack.storage, "faults/azurite/job.yaml", harness.sweep("azurite", FEW))
            harness.wait_progress(stack.storage, job_id, FEW // 4)
            counted = harness.progress(stack.storage, job_id)
            stopped_at = now_iso()
            stack.azurite.stop()  # SIGTERM, as a container stop would
            time.sleep(3)  # storage stays away for a while: the fault itself, not a wait for a state
            stack.azurite.start()  # same ports, same --location
            counts.restarts += 1
            harness.verify(stack, job_id, counts)
        harness.no_orphans(stack)
        # The fault met work: shards were still uncounted when storage went, and some finished after it.
        assert counted < FEW, counted
        after = [r.shard_id for r in Ledger(stack.storage).shards(job_id) if r.finished_at > stopped_at]
        assert after, f"every shard had finished before Azurite stopped at {stopped_at}"


def test_devhost_killed_and_restarted(stack):
    """SIGKILL the Functions host process mid-run and start a new one: the agents it spawned go on,
    blob receipts and leases let the new host finish what the old one had claimed."""
    with harness.recorded("devhost SIGKILL", shards=FEW) as counts:
        host = harness.HostProcess(stack)
        host.start()
        try:
            job_id = harness.upload(stack.storage, "faults/devhost/job.yaml", harness.sweep("devhost", FEW))
            harness.wait_progress(stack.storage, job_id, FEW // 5)
            host.kill()
            counts.kills += 1
            # Only a host counts shards and builds the report: what is uncounted now was left to the next one.
            left = FEW - harness.progress(stack.storage, job_id)
            assert left > 0 and not Ledger(stack.storage).job(job_id).reported, left
            host.start()
            counts.restarts += 1
            harness.verify(stack, job_id, counts, drain_timeout=90)
        finally:
            host.stop()
            harness.close_workers(stack)
        harness.no_orphans(stack)


def test_preemption_storm(stack):
    """SIGTERM agents at random (sometimes all at once): the payload checkpoints and exits 75, the
    message is visible again at once, and a preemption is recorded, never a failure."""
    with harness.recorded("SIGTERM storm", shards=STORM_SHARDS) as counts:
        with harness.in_process_host(stack):
            job_id = harness.upload(stack.storage, "faults/preempt/job.yaml",
                                    harness.sweep("preempt", STORM_SHARDS, sleep_s=0.3))
            harness.wait_progress(stack.storage, job_id, 1)
            storm = Injector(3, signal_worker(stack, signal.SIGTERM, everyone=True), 0.8, 2.0)
            storm.start()
            harness.wait_progress(stack.storage, job_id, STORM_SHARDS * 3 // 4, timeout=180)
            counts.kills = storm.stop()
            harness.verify(stack, job_id, counts)
        harness.no_orphans(stack)
        assert counts.preemptions >= 5, counts
        assert counts.retries == 0, "a preemption was counted as a failure"
