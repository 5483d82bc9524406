"""Issue 23, acceptance f: an artifact blob does not invoke ``collect``.

A shard writes its result (``results/<job>/<shard>.json``) and artifacts beside it: here each
attempt that fails first prints, so it uploads ``results/<job>/<shard>/payload.log`` (its silent retry then
deletes it: workers.staging.keep_log). On Azure the results event
subscription filters subjects on ``subjectEndsWith: '.json'`` (bicep/main.bicep's
``blobTriggers``); the devhost's publisher reads the same filter, so here, as there,
only the results raise an event for ``collect``. The invocations are counted
through the devhost's records while a job runs with real agents on Azurite.
"""

from __future__ import annotations

import azure.functions as func
import pytest

from tests.faults import harness
from upwell import names

pytestmark = pytest.mark.cloudfaults
SHARDS = 8


def test_an_artifact_blob_does_not_invoke_collect(stack):
    with harness.recorded("artifact blobs (collect filter)", shards=SHARDS) as counts:
        with harness.in_process_host(stack) as host:
            harness.wait_until(lambda: host.publisher.subscribed, 20, "the event subscriptions")
            grid = {"r": harness.r_values(SHARDS // 2), "fail_first_attempts": [0, 1]}
            job_id = harness.upload(stack.storage, "cloudfaults/artifacts/job.yaml",
                                    harness.sweep("artifact blobs", grid=grid))
            harness.verify(stack, job_id, counts)
            collected = [r for r in host.invocations if r.function == "collect"]
        harness.no_orphans(stack)
    # half the shards failed once, printing, so each wrote a payload.log beside its result's place
    assert counts.retries == SHARDS // 2, counts
    blobs = [b.name for b in stack.storage.list(names.RESULTS, f"{job_id}/")]
    assert len(blobs) == SHARDS, blobs  # the results alone: each retry printed nothing and left no stale log
    # One invocation per result; none for the artifacts, which an unfiltered subscription would deliver too.
    assert len(collected) == SHARDS, [(r.function, r.outcome) for r in collected]
    assert all(r.outcome == "succeeded" for r in collected)
    assert counts.lost == 0


def test_collect_drops_an_artifact_by_its_name_before_opening_storage(monkeypatch):
    """A `.json` artifact passes the subscription's suffix filter; the trigger drops it by name alone."""
    import handlers.collect
    import handlers.context

    opened: list[str] = []

    def storage():
        opened.append("storage")
        raise RuntimeError("storage opened")

    def event(container: str, name: str) -> func.EventGridEvent:
        return func.EventGridEvent(id="1", data={}, topic="t", event_type="Microsoft.Storage.BlobCreated",
                                   subject=f"/blobServices/default/containers/{container}/blobs/{name}",
                                   event_time=None, data_version="")

    monkeypatch.setattr(handlers.context, "storage", storage)
    handlers.collect.collect(event("results", "job-1/shard-0001/metrics.json"))
    handlers.collect.collect(event("incoming", "job-1/shard-0001.json"))  # another container's blob
    assert opened == []
    with pytest.raises(RuntimeError, match="storage opened"):  # a result's name does open it: the stub can fire
        handlers.collect.collect(event("results", "job-1/shard-0001.json"))
    assert opened == ["storage"]
