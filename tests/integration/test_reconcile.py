"""The reconciler against its own Azurite: every trace a lost event leaves is found and re-driven once.

Uploads with no event (no host ran), dead-lettered events, poisoned blob-trigger
messages, results that were never collected, and an input whose re-drive keeps
failing (quarantined with RedriveExhausted). A second pass finds nothing (the
watermark), a dry run changes nothing, and ``upwell status`` lists the actions.
Issue 26's crash windows (marker ``afterjob``), driven as job-row states: an analysis
claimed whose reduce job was never accepted, an event claimed that never reached
the ``notify`` queue.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.faults.harness import sweep
from tests.pipeline_helpers import module_azurite
from upwell import names
from upwell.after import reduce
from upwell.after import state as after_state
from upwell.after.spec import NotifySpec, ReduceSpec, row_fields
from upwell.errors import InputRejected
from upwell.ingest.blobnames import job_id_for
from upwell.ingest.ingestor import Ingestor
from upwell.ledger import JobRow, JobState, Ledger
from upwell.ops.reconcile import Reconciler, recent_actions
from upwell.scalelog import ScalingLog, fresh_reconcile_state
from upwell.settings import Settings
from upwell.storage import Storage
from upwell.timeutil import now_iso

# A pass lists whole containers, so no other test's blobs may be in them.
own_azurite = module_azurite("reconcile", name="own_azurite")


@pytest.fixture
def store(own_azurite, monkeypatch) -> Storage:
    monkeypatch.setenv(names.CONNECTION, own_azurite.connection_string)
    storage = Storage(own_azurite.connection_string)
    storage.ensure()
    # Each test starts from a clean slate: no watermark, no leftovers in the places a pass reads.
    for container in (names.INCOMING, names.EVENTGRID_DEADLETTER):
        client = storage.container(container)
        if not client.exists():
            client.create_container()  # on Azure the templates create the dead-letter container
        else:
            for blob in client.list_blobs():
                client.delete_blob(blob.name)
    ScalingLog(storage).save_reconcile_state(fresh_reconcile_state())
    storage.queue(names.BLOB_POISON_QUEUE).create_queue() if not _exists(storage) else \
        storage.queue(names.BLOB_POISON_QUEUE).clear_messages()
    return storage


def _exists(storage: Storage) -> bool:
    try:
        storage.queue(names.BLOB_POISON_QUEUE).get_queue_properties()
        return True
    except Exception:  # noqa: BLE001
        return False


def settings(**kw) -> Settings:
    return dataclasses.replace(Settings.from_env(), **{"reconcile_grace_s": 0, **kw})


def upload(store: Storage, name: str, data: bytes) -> str:
    etag = store.blob(names.INCOMING, name).upload_blob(data, overwrite=True)["etag"]
    return job_id_for(name, etag)


def test_an_upload_no_event_started_is_ingested_once_and_the_watermark_spares_it_next_time(store):
    tag = uuid.uuid4().hex[:6]
    job_id = upload(store, f"rec-{tag}/job.yaml", sweep("missed", 3))
    upload(store, f"rec-{tag}/data/input.csv", b"a,b\n1,2\n")  # a manifest's input: never a job
    time.sleep(1.1)
    first = Reconciler(store, settings()).run()
    assert [(a.kind, a.target, a.outcome) for a in first.actions] == [
        ("missed_upload", f"incoming/rec-{tag}/job.yaml", "redriven")]
    assert Ledger(store).job(job_id).shards_total == 3
    second = Reconciler(store, settings()).run()
    assert second.actions == [] and second.checked == 0 and second.watermark >= first.watermark > 0


def test_a_young_upload_waits_for_its_event_and_a_dry_run_changes_nothing(store):
    job_id = upload(store, f"young-{uuid.uuid4().hex[:6]}/job.yaml", sweep("young", 2))
    assert Reconciler(store, settings(reconcile_grace_s=600)).run().actions == []
    time.sleep(1.1)
    dry = Reconciler(store, settings(), dry_run=True).run()
    assert [(a.kind, a.outcome) for a in dry.actions] == [("missed_upload", "would_redrive")]
    assert Ledger(store).job(job_id) is None
    assert Reconciler(store, settings()).run().count("missed_upload") == 1, "the dry run kept no watermark"
    assert Ledger(store).job(job_id) is not None


def test_dead_lettered_and_poisoned_events_are_redriven_and_removed(store):
    tag = uuid.uuid4().hex[:6]
    dead_job = upload(store, f"dl-{tag}/job.yaml", sweep("dead", 2))
    poison_job = upload(store, f"po-{tag}/job.yaml", sweep("poison", 2))
    # A long grace below keeps the incoming/ scan off these two: only the dead letter and poison paths act.
    event = {"eventType": "Microsoft.Storage.BlobCreated", "deadLetterReason": "NonRetriableHttpStatus",
             "subject": f"/blobServices/default/containers/incoming/blobs/dl-{tag}/job.yaml", "data": {}}
    store.write(f"{names.EVENTGRID_DEADLETTER}/TOPIC/BLOB-INGEST/2026/01/01/00/{tag}.json", json.dumps([event]))
    store.queue(names.BLOB_POISON_QUEUE).send_message(json.dumps(
        {"Type": "BlobTrigger", "FunctionId": "Host.Functions.ingest", "BlobType": "Block",
         "ContainerName": "incoming", "BlobName": f"po-{tag}/job.yaml", "ETag": '"x"'}))
    result = Reconciler(store, settings(reconcile_grace_s=600)).run()  # young: only these two paths act
    assert sorted((a.kind, a.outcome) for a in result.actions) == [("dead_letter", "redriven"),
                                                                   ("poison", "redriven")]
    assert Ledger(store).job(dead_job) and Ledger(store).job(poison_job)
    assert list(store.list(names.EVENTGRID_DEADLETTER)) == []
    assert store.queue(names.BLOB_POISON_QUEUE).peek_messages() == []


def test_a_result_that_was_never_collected_counts_its_shard(store):
    tag = uuid.uuid4().hex[:6]
    name = f"res-{tag}/job.yaml"
    job_id = upload(store, name, sweep("result", 2))
    Ingestor(store, Settings.from_env()).ingest(name)
    store.write(f"{names.RESULTS}/{job_id}/s00000.json", json.dumps({"status": "succeeded", "timings": {}}))
    time.sleep(1.1)
    result = Reconciler(store, settings()).run()
    assert [(a.kind, a.outcome) for a in result.actions] == [("uncollected_result", "redriven")]
    assert Ledger(store).shard(job_id, "s00000").status == "succeeded"
    assert Ledger(store).shard(job_id, "s00001").status == "queued"
    assert Reconciler(store, settings()).run().actions == []


def test_an_input_that_keeps_failing_is_quarantined_with_a_named_error(store, monkeypatch):
    name = f"broken-{uuid.uuid4().hex[:6]}/job.yaml"
    job_id = upload(store, name, sweep("broken", 2))
    time.sleep(1.1)

    def fail(self, blob_name):
        raise RuntimeError("storage keeps timing out")
    monkeypatch.setattr(Ingestor, "ingest", fail)
    outcomes = [[a.outcome for a in Reconciler(store, settings(reconcile_max_redrives=2)).run().actions]
                for _ in range(2)]
    assert outcomes == [["failed"], ["quarantined"]]
    error = json.loads(store.read(f"{names.QUARANTINE}/{name}.error.json"))
    assert error["error"] == "RedriveExhausted" and "storage keeps timing out" in error["message"]
    assert Ledger(store).job(job_id).status == "rejected"
    assert not store.exists(f"{names.INCOMING}/{name}")
    monkeypatch.undo()
    assert Reconciler(store, settings()).run().actions == [], "resolved: nothing left to find"


def test_the_command_line_and_status_show_every_action(store, monkeypatch):
    from upwell.cli import app

    upload(store, f"cli-{uuid.uuid4().hex[:6]}/job.yaml", sweep("cli", 2))
    time.sleep(1.1)
    monkeypatch.setenv("UPWELL_RECONCILE_GRACE_S", "0")
    runner = CliRunner()
    dry = runner.invoke(app, ["reconcile", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "would_redrive" in dry.output and "missed_upload" in dry.output
    done = runner.invoke(app, ["reconcile"])
    assert done.exit_code == 0 and "redriven" in done.output, done.output
    assert recent_actions(store)[0]["outcome"] == "redriven"
    status = runner.invoke(app, ["status"])
    assert status.exit_code == 0 and "reconciler: latest actions" in status.output, status.output


def test_the_timer_function_is_registered_on_its_schedule():
    from upwell.local.devhost.app import load_functions

    spec = {s.name: s for s in load_functions("function_app:app", Path(__file__).resolve().parents[2])}["reconcile"]
    assert spec.trigger["type"] == "timerTrigger" and spec.trigger["schedule"] == "%UPWELL_RECONCILE_SCHEDULE%"
    assert Settings().reconcile_schedule == "0 */5 * * * *"


def test_a_terminal_job_without_a_report_gets_its_report_message_again(store):
    job_id = f"unreported-{uuid.uuid4().hex[:8]}"
    Ledger(store).create_job(JobRow(job_id=job_id, status=JobState.SUCCEEDED, finished_at="2020-01-01T00:00:00+00:00",
                                    shards_total=1, shards_done=1))
    store.queue(names.REPORT_QUEUE).clear_messages()
    result = Reconciler(store, settings()).run()
    assert [(a.kind, a.target, a.outcome) for a in result.actions if a.kind == "unreported_job"] == [
        ("unreported_job", job_id, "requeued")]
    assert [json.loads(m.content) for m in store.queue(names.REPORT_QUEUE).peek_messages()] == [{"job_id": job_id}]
    Ledger(store).update_job(job_id, reported=True)
    assert Reconciler(store, settings()).run().count("unreported_job") == 0


def _ended_job(ledger: Ledger, reduce_payload: str = "heat-order", **fields) -> str:
    """A job that ended with a reduce and a notification asked for (as the ingest records them)."""
    job_id = f"crash-{uuid.uuid4().hex[:8]}"
    asks = row_fields(None, ReduceSpec(payload=reduce_payload), NotifySpec(events=["completed"], eventgrid=False))
    ledger.create_job(JobRow.from_entity({"PartitionKey": job_id, "RowKey": names.JOB_ROW, **asks, **fields,
                                          "status": JobState.SUCCEEDED.value, "shards_total": 1, "shards_done": 1,
                                          "pool": "cpu", "project": "default", "finished_at": now_iso()}))
    return job_id


def _messages(store: Storage, queue: str) -> list[dict]:
    return [json.loads(m.content) for m in store.queue(queue).peek_messages(max_messages=32)]


@pytest.mark.afterjob
def test_a_lost_reduce_start_and_an_unqueued_event_are_completed_once(store):
    ledger = Ledger(store)
    for queue in (names.NOTIFY_QUEUE, names.work_queue("cpu")):
        store.queue(queue).clear_messages()
    job_id = _ended_job(ledger)
    reduce_id = after_state.claim_analysis(ledger, job_id)  # (a) claimed; the process died before accepting it
    assert after_state.claim_events(ledger, job_id, ["completed"]) == ["completed"]  # (b) claimed, never queued

    young = Reconciler(store, settings(reconcile_grace_s=3600)).run(steps=("after",))  # its claimant may be at work
    assert young.actions == [] and ledger.job(reduce_id) is None and _messages(store, names.NOTIFY_QUEUE) == []

    first = Reconciler(store, settings()).run(steps=("after",))
    assert sorted((a.kind, a.target, a.outcome) for a in first.actions) == [
        ("lost_reduce", job_id, "redriven"), ("unqueued_event", job_id, "redriven")]
    child = ledger.job(reduce_id)
    assert child is not None and child.status == JobState.ACCEPTED and after_state.field(child, "reduce_of") == job_id
    assert [(w["job_id"], w["shard_id"], w["input_blob"]) for w in _messages(store, names.work_queue("cpu"))] == [
        (reduce_id, "reduce", f"{names.RESULTS}/{job_id}/")]
    assert _messages(store, names.NOTIFY_QUEUE) == [{"job_id": job_id, "event": "completed"}]
    parent = ledger.job(job_id)
    assert after_state.field(parent, "analysis_state") == "running"
    assert after_state.field(parent, "notify_queued") == "completed"

    ScalingLog(store).save_reconcile_state(fresh_reconcile_state())  # the widest window: still nothing to do
    assert Reconciler(store, settings()).run(steps=("after",)).actions == []
    assert len(_messages(store, names.work_queue("cpu"))) == 1 and len(_messages(store, names.NOTIFY_QUEUE)) == 1


@pytest.mark.afterjob
def test_a_rerun_accepts_its_own_lost_start_again_instead_of_refusing(store):
    ledger = Ledger(store)
    job_id = _ended_job(ledger)
    lost = after_state.claim_analysis(ledger, job_id)
    assert reduce.rerun(store, settings(), job_id, ledger) == lost  # the same attempt, not "running already"
    assert ledger.job(lost) is not None and after_state.attempt(ledger.job(job_id)) == 1
    with pytest.raises(InputRejected, match="running already"):
        reduce.rerun(store, settings(), job_id, ledger)  # its reduce job exists now: it runs


@pytest.mark.afterjob
def test_a_lost_reduce_that_cannot_start_fails_the_analysis_and_the_report_says_so(store):
    ledger = Ledger(store)
    job_id = _ended_job(ledger, "no-such-reduce", reported=True)  # its report was built, saying "running"
    reduce_id = after_state.claim_analysis(ledger, job_id)
    first = Reconciler(store, settings()).run(steps=("after",))
    assert [(a.kind, a.outcome) for a in first.actions] == [("lost_reduce", "redriven")]
    assert "could not start" in first.actions[0].detail and ledger.job(reduce_id) is None
    parent = ledger.job(job_id)
    assert after_state.field(parent, "analysis_state") == "failed" and "no-such-reduce" in after_state.field(
        parent, "analysis_error")
    summary = json.loads(store.read(f"{names.REPORTS}/{job_id}/summary.json"))
    assert summary["analysis"]["status"] == "failed"
    assert Reconciler(store, settings()).run(steps=("after",)).actions == []
