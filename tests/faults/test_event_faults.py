"""Faults on the event path (Event Grid -> blobs webhook -> host queue), through the real pipeline.

The devhost runs the blob triggers as Flex Consumption does (``source=EventGrid``):
a local publisher delivers BlobCreated events to the blobs webhook. Each test
injects one fault on that path while a job of ``SHARDS`` logistic shards runs,
then stops the fault and checks that the job is whole (``harness.verify``: lost = 0,
one report, queues drained, nothing left in ``webjobs-blobtrigger-poison``) within
one reconcile period (``UPWELL_RECONCILE_SCHEDULE`` every 5 s here, grace 4 s, plus
the time the last re-driven shards take). With the reconciler off, dropped events
leave the job stuck: that is what makes these tests able to fail.
"""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager

from tests.faults import harness
from upwell import names
from upwell.ledger import Ledger
from upwell.local.devhost.publisher import EventFaults

SHARDS = 30
PERIOD_S, GRACE_S = 5, 4  # harness.environment: the reconcile timer and its grace
# After the faults stop: one reconcile period and its grace, then the re-driven work itself (agents may
# have to start again: scale timer every 2 s, a payload launch ~1 s each on 2 cores).
RECOVERY_S = PERIOD_S + GRACE_S + 45
ALL_BUT_RECONCILE = ["ingest", "collect", "scale", "report", "jobs", "job"]


def results_written(storage, job_id: str) -> int:
    return sum(1 for b in storage.list(names.RESULTS, f"{job_id}/") if b.name.count("/") == 1)


def wait_results(stack, job_id: str, shards: int, timeout: float = 150) -> None:
    harness.wait_until(lambda: results_written(stack.storage, job_id) >= shards, timeout,
                       f"{shards} results of {job_id}")


def recover(stack, host, job_id: str, counts: harness.Counts) -> float:
    """Stop the faults, and time how long until the job is reported; verify it is whole."""
    if host.publisher is not None:
        host.publisher.set_faults(EventFaults())
    stopped = time.monotonic()
    harness.wait_reported(stack.storage, job_id, timeout=RECOVERY_S)
    took = time.monotonic() - stopped
    harness.verify(stack, job_id, counts)
    return took


def event_run(stack, fault: str, faults: EventFaults, **host_options) -> tuple[harness.Counts, dict, float]:
    with harness.recorded(fault, shards=SHARDS) as counts:
        with harness.in_process_host(stack, event_faults=faults, **host_options) as host:
            harness.wait_until(lambda: host.publisher.subscribed, 20, "the event subscriptions")
            job_id = harness.upload(stack.storage, f"faults/{fault.split()[0]}/job.yaml",
                                    harness.sweep(fault, SHARDS))
            wait_results(stack, job_id, SHARDS)
            took = recover(stack, host, job_id, counts)
            counts.recovery_s = round(took, 1)
            stats = dict(host.publisher.stats)
        harness.no_orphans(stack)
        counts.duplicates = stats.get("duplicated", 0)
        counts.retries = stats.get("retried", 0) + stats.get("dead_lettered", 0) + stats.get("dropped", 0)
    return counts, stats, took


def test_ten_percent_of_events_dropped(stack):
    """10% of BlobCreated events never arrive: the reconciler ingests and collects what they missed."""
    counts, stats, took = event_run(stack, "dropped events", EventFaults(drop=0.1, seed=11))
    assert stats["dropped"] >= 1, stats  # else this run proved nothing
    assert took <= RECOVERY_S, took


def test_with_the_reconciler_off_dropped_events_leave_the_job_stuck(stack):
    """The same faults without the reconciler: the job is never reported. One pass then makes it whole."""
    from upwell.ops.reconcile import Reconciler
    from upwell.settings import Settings

    with harness.recorded("dropped, no reconciler", shards=SHARDS) as counts:
        with harness.in_process_host(stack, event_faults=EventFaults(drop=0.1, seed=11),
                                     functions=ALL_BUT_RECONCILE) as host:
            harness.wait_until(lambda: host.publisher.subscribed, 20, "the event subscriptions")
            job_id = harness.upload(stack.storage, "faults/stuck/job.yaml", harness.sweep("dropped events", SHARDS))
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and results_written(stack.storage, job_id) < SHARDS:
                time.sleep(1)
            host.publisher.set_faults(EventFaults())
            time.sleep(PERIOD_S + GRACE_S + 5)  # longer than one reconcile period: nothing comes
            dropped = host.publisher.stats["dropped"]
            job = Ledger(stack.storage).job(job_id)
            assert dropped >= 1 and not (job and job.reported), (dropped, job and job.status)
            stuck = SHARDS - harness.progress(stack.storage, job_id)
            assert stuck >= 1, "every shard was counted although events were dropped"
            Reconciler(stack.storage, Settings.from_env()).run()  # what the timer would have done
            harness.verify(stack, job_id, counts)
        harness.no_orphans(stack)
        counts.retries = dropped


def test_duplicated_and_reordered_events(stack):
    """A third of the events twice, each delayed up to 3 s (so out of order): each shard still counts once."""
    counts, stats, _ = event_run(stack, "duplicated+reordered", EventFaults(duplicate=0.33, delay=3.0, seed=5))
    assert stats["duplicated"] >= 3, stats


def test_a_401_dead_letters_events_and_the_reconciler_redrives_them(stack):
    """A fifth of the deliveries carry a stale key (as after a key rotation): 401, dead-lettered at once."""
    counts, stats, took = event_run(stack, "401 dead-lettered", EventFaults(fail_401=0.2, seed=3))
    assert stats["dead_lettered"] >= 1, stats
    # A dead letter whose blob the results scan already collected is removed at the next pass.
    harness.wait_until(lambda: not list(stack.storage.list(names.EVENTGRID_DEADLETTER)), PERIOD_S * 3,
                       "every dead letter re-driven and removed")
    assert took <= RECOVERY_S, took


def test_5xx_deliveries_are_retried_by_event_grid(stack):
    """A quarter of the delivery attempts answered 503: retried on the schedule (scaled down), none lost."""
    counts, stats, _ = event_run(stack, "5xx retried", EventFaults(fail_5xx=0.25, retry_scale=0.1, seed=4))
    assert stats["failed_5xx"] >= 1 and stats["retried"] >= 1, stats


def test_a_blob_that_poisons_is_redriven_from_the_poison_queue(stack, monkeypatch):
    """ingest fails five times in a row for the manifest (poisonBlobThreshold): the message goes to
    webjobs-blobtrigger-poison; the reconciler re-drives it from there once the failures stop."""
    from upwell.ingest.ingestor import Ingestor

    real, calls = Ingestor.ingest, {"n": 0}

    def flaky(self, name):
        if name.startswith("faults/poisoned/") and calls["n"] < 5:
            calls["n"] += 1
            raise ConnectionError("injected: storage throttled")
        return real(self, name)
    monkeypatch.setattr(Ingestor, "ingest", flaky)
    with harness.recorded("blob poisoned", shards=SHARDS) as counts:
        with harness.in_process_host(stack) as host:
            harness.wait_until(lambda: host.publisher.subscribed, 20, "the event subscriptions")
            job_id = harness.upload(stack.storage, "faults/poisoned/job.yaml", harness.sweep("poisoned", SHARDS))
            harness.wait_until(lambda: calls["n"] >= 5, 30, "five failed tries")
            stopped = time.monotonic()
            harness.wait_reported(stack.storage, job_id, timeout=RECOVERY_S)
            took = time.monotonic() - stopped
            counts.recovery_s = round(took, 1)
            harness.verify(stack, job_id, counts)
            failed = [r for r in host.invocations if r.function == "ingest" and r.outcome == "failed"]
            assert len(failed) == 5, [r.error for r in failed]
        harness.no_orphans(stack)
        counts.retries = len(failed)
    assert took <= RECOVERY_S, took


@contextmanager
def _released(event: threading.Event):
    """Set ``event`` on the way out, however the block ends: a hung call that was never cancelled ends too."""
    try:
        yield
    finally:
        event.set()


def test_a_function_that_times_out_is_cancelled_and_retried(stack, monkeypatch):
    """The first ingest of the manifest hangs past functionTimeout (20 s here; every function gets it, and
    a report takes several seconds on a busy machine): cancelled, counted as a failure, run again at
    once; the second run ingests it."""
    from upwell.ingest.ingestor import Ingestor

    real, calls = Ingestor.ingest, {"n": 0}
    release, ended, ran_on = threading.Event(), threading.Event(), []  # release: set only after the test

    def hangs_once(self, name):
        if name.startswith("faults/timeout/"):
            calls["n"] += 1
            if calls["n"] == 1:  # hangs until released: only the host's cancellation ends it in time
                try:
                    while not release.is_set():  # short sleeps, so that the host's cancellation lands
                        time.sleep(0.05)
                    ran_on.append(name)
                finally:
                    ended.set()
        return real(self, name)
    monkeypatch.setattr(Ingestor, "ingest", hangs_once)
    host_json = json.loads((harness.REPO / "host.json").read_text())
    host_json["functionTimeout"] = "00:00:20"
    with harness.recorded("function timeout", shards=SHARDS) as counts, _released(release):
        with harness.in_process_host(stack, host_json=host_json) as host:
            harness.wait_until(lambda: host.publisher.subscribed, 20, "the event subscriptions")
            job_id = harness.upload(stack.storage, "faults/timeout/job.yaml", harness.sweep("timeout", SHARDS))
            harness.verify(stack, job_id, counts)
            # The reconciler may have ingested the upload while the first invocation hung (its grace is
            # shorter than functionTimeout): wait for the timed-out invocation and its retry to be recorded.
            harness.wait_until(lambda: sum(1 for r in host.invocations if r.function == "ingest") >= 2, 60,
                               "the timed-out ingest and its retry")
            ingests = [r for r in host.invocations if r.function == "ingest"]
            assert [r.outcome for r in ingests][:2] == ["failed", "succeeded"], ingests
            assert "FunctionTimeoutError" in ingests[0].error and ingests[0].duration_s >= 20
            assert ended.wait(10) and ran_on == [], "the timed-out ingest was not cancelled"
        harness.no_orphans(stack)
        counts.retries = 1


def test_a_blob_uploaded_while_no_host_ran_is_processed_once_host_and_reconciler_run(stack):
    """Uploaded before any host (so before the event subscription) existed: no event ever comes;
    the reconciler's first pass after its grace ingests it."""
    with harness.recorded("uploaded with no host", shards=SHARDS) as counts:
        job_id = harness.upload(stack.storage, "faults/nohost/job.yaml", harness.sweep("nohost", SHARDS))
        time.sleep(1.1)  # last-modified has one-second resolution
        with harness.in_process_host(stack) as host:
            started = time.monotonic()
            harness.verify(stack, job_id, counts)
            assert host.publisher.stats["published"] >= SHARDS and host.publisher.stats["delivered"] >= SHARDS
            ingests = [r for r in host.invocations if r.function == "ingest"]
            assert ingests == [], "the upload predates the subscription: no event, only the reconciler"
            assert time.monotonic() - started <= RECOVERY_S + 60
        harness.no_orphans(stack)
