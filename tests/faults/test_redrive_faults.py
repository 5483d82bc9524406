"""The reconciler and a long ingest, through the real pipeline (issue 24, item 1).

An ingest holds a lease on its job row that it renews while it enqueues (upwell.ingest.lease). (a) A re-drive
started while a long ingest still renews it does nothing to it: the reconciler leaves it for the next pass, a
second delivery steps back, and no counter falls. (b) An ingest that stops half-way, on a host killed with
SIGKILL, is re-driven by the reconciler once its lease has lapsed: the re-drive sends only what had not gone
out, and the job ends whole. The ingest is made long through the enqueue's test seam (``SEND_HOOK``), not by a
big grid. Without the lease, (a) fails (the reconciler re-drives at once and the merge resets ``shards_done``),
and so does (b)'s resume check (the re-drive sends every item again).
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

from tests.faults import harness
from upwell import names
from upwell.ingest import accept
from upwell.ingest.ingestor import Ingestor
from upwell.ledger import Ledger
from upwell.ops.reconcile import Reconciler
from upwell.settings import Settings

FEW = 24  # enough for a half that runs before the other half is sent; more only adds run time
HALF = FEW // 2


def test_a_redrive_during_a_long_ingest_leaves_it_alone(stack, monkeypatch):
    """The enqueue holds at item HALF while shards before it run; a reconcile pass (grace 0) and a second
    delivery of the upload meanwhile change nothing: the job ends with every shard counted once."""
    reached, go = threading.Event(), threading.Event()

    def hold(index: int) -> None:
        if index == HALF:
            reached.set()
            go.wait(120)

    monkeypatch.setattr(accept, "SEND_HOOK", hold)
    name = "faults/live/job.yaml"
    with harness.recorded("re-drive during a live ingest", shards=FEW) as counts:
        try:
            with harness.in_process_host(stack):
                job_id = harness.upload(stack.storage, name, harness.sweep("live", FEW))
                harness.wait_until(reached.is_set, 60, "the ingest to reach item HALF")
                harness.wait_progress(stack.storage, job_id, 3)  # shards before HALF ran and were counted
                ledger = Ledger(stack.storage)
                before = ledger.job(job_id)
                settings = dataclasses.replace(Settings.from_env(), reconcile_grace_s=0)
                passed = Reconciler(stack.storage, settings).run(("incoming",))
                again = Ingestor(stack.storage, settings).ingest(name)
                after = ledger.job(job_id)
                assert before.status == after.status == "ingesting", (before.status, after.status)
                assert [a.target for a in passed.actions] == [], passed.actions
                assert again.status == "leased", again
                assert after.ingest_owner == before.ingest_owner
                assert after.created_at == before.created_at
                assert after.shards_done >= before.shards_done > 0, (before.shards_done, after.shards_done)
                assert after.spent_usd >= before.spent_usd
                counts.duplicates = 1
                go.set()
                harness.verify(stack, job_id, counts)
        finally:
            go.set()
        harness.no_orphans(stack)


class StalledHost(harness.HostProcess):
    module = "tests.faults.stalled_ingest"


def test_an_ingest_killed_half_way_is_redriven_once_its_lease_lapses(stack, monkeypatch):
    """A host whose ingest stalls at item HALF is killed; the reconciler re-drives the ingest once its 2 s
    lease has lapsed, sends exactly the items from the lease's mark on, and the job ends with
    one report, every shard counted once. No agent runs before the re-drive, so that every item before the
    mark is still queued: only the mark keeps it from being sent again."""
    mark_file = stack.root / "stalled"
    stack.env["UPWELL_INGEST_LEASE_S"] = "2"
    harness.apply_env(monkeypatch, stack.env)
    stalled = harness.Stack(stack.root, stack.azurite, {
        **stack.env, "UPWELL_TEST_STALL_AT": str(HALF), "UPWELL_TEST_STALL_MARK": str(mark_file),
        "UPWELL_TEST_SEND_DELAY_S": "0.4"})
    sent: list[int] = []
    monkeypatch.setattr(accept, "SEND_HOOK", sent.append)
    name = "faults/stalled/job.yaml"
    with harness.recorded("ingest killed half-way", shards=FEW) as counts:
        host = StalledHost(stalled)
        host.start()
        try:
            # its Event Grid subscriptions exist once it has started: an upload before then has no event
            harness.wait_until(lambda: '"devhost.started"' in host.log.read_text(), 60, "the host to start")
            job_id = harness.upload(stack.storage, name, harness.sweep("stalled", FEW))
            harness.wait_until(Path(mark_file).exists, 60, "the ingest to stall at item HALF")
            # The items before HALF finish on the other enqueue threads and the lease's next beat records them;
            # a kill in the instant between the stall and that beat would leave the mark at 0 (seen once).
            harness.wait_until(lambda: getattr(Ledger(stack.storage).job(job_id), "ingest_sent", 0) > 0, 30,
                               "the lease to record the items sent before the stall")
            host.kill()
            counts.kills += 1
        finally:
            host.stop()
        job = Ledger(stack.storage).job(job_id)
        assert job.status == "ingesting" and 0 < job.ingest_sent <= HALF, (job.status, job.ingest_sent)
        reconciler_settings = Settings.from_env()

        def redriven() -> list:
            done = Reconciler(stack.storage, reconciler_settings).run(("incoming",))
            return [a for a in done.actions if a.target == f"{names.INCOMING}/{name}"]

        actions = harness.wait_until(redriven, 30, "the reconciler to re-drive the stalled ingest", interval=0.5)
        assert [(a.kind, a.outcome) for a in actions] == [("stuck_ingest", "redriven")], actions
        assert sorted(sent) == list(range(job.ingest_sent, FEW)), (job.ingest_sent, sorted(sent))
        with harness.in_process_host(stack):
            counts.restarts += 1
            harness.verify(stack, job_id, counts, drain_timeout=90)
        harness.no_orphans(stack)
