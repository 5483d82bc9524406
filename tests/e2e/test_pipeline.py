"""End to end on real Azurite: the real function_app handlers driven by the devhost, local workers
started by the scale timer, results collected, the report written exactly once."""

from __future__ import annotations

import json
import time

import pytest

from tests.pipeline_helpers import kill, live_worker_pids, pipeline_env, running_host, wait_reported
from upwell import names
from upwell.ingest.blobnames import job_id_for
from upwell.ledger import Ledger
from upwell.scalelog import ScalingLog
from upwell.storage import Storage

SWEEP = b"""name: e2e sweep
payload: logistic
params: {steps: 500, burn_in: 100, sleep_s: 0.3}
grid: {r: [2.9, 3.3, 3.5, 3.9]}
"""


@pytest.fixture
def store(azurite):
    s = Storage(azurite.connection_string)
    s.ensure()
    return s


def _upload(store: Storage, name: str, data: bytes) -> str:
    etag = store.blob(names.INCOMING, name).upload_blob(data, overwrite=True)["etag"]
    return job_id_for(name, etag)


def test_upload_through_sdk_reaches_report(store, azurite, tmp_path, monkeypatch):
    pipeline_env(monkeypatch, azurite.connection_string, tmp_path)
    with running_host(azurite.connection_string, tmp_path):
        job_id = _upload(store, "e2e/sweep/job.yaml", SWEEP)
        job = wait_reported(store, job_id)
        assert job.status == "succeeded" and job.shards_done == 4
        summary = json.loads(store.read(f"reports/{job_id}/summary.json"))
        html = store.read(f"reports/{job_id}/index.html").decode()
        assert "data:image/png;base64," in html and job_id in html
        # The summary is the job's: every shard succeeded, with its result and its own parameter.
        assert summary["job"]["id"] == job_id and summary["job"]["status"] == "succeeded"
        assert summary["counts"]["shards_total"] == summary["counts"]["succeeded"] == 4
        assert summary["counts"]["results"] == 4 and summary["failures"] == []
        assert sorted((r["shard_id"], r["status"], r["has_result"]) for r in summary["shards"]) == \
            [(f"s0000{i}", "succeeded", True) for i in range(4)]
        assert sorted(r["params"]["r"] for r in summary["shards"]) == [2.9, 3.3, 3.5, 3.9]
        assert {r.name for r in store.list(names.RESULTS, f"{job_id}/") if r.name.count("/") == 1} == \
            {f"{job_id}/s0000{i}.json" for i in range(4)}
        assert job.report_count == 1
        assert max(d.target for d in ScalingLog(store).decisions("cpu")) >= 1
    assert live_worker_pids(tmp_path) == []


def test_bad_upload_quarantined_and_host_keeps_going(store, azurite, tmp_path, monkeypatch):
    pipeline_env(monkeypatch, azurite.connection_string, tmp_path)
    with running_host(azurite.connection_string, tmp_path) as host:
        bad_id = _upload(store, "e2e/bad/job.yaml", b"payload: logistic\ngrid: {r: [3.0]}\nshell: rm -rf /\n")
        assert wait_reported(store, bad_id, 30).status == "rejected"
        err = json.loads(store.read("quarantine/e2e/bad/job.yaml.error.json"))
        assert err["field"] == "shell" and "Extra inputs" in err["message"]
        good_id = _upload(store, "e2e/good/job.yaml", SWEEP.replace(b"[2.9, 3.3, 3.5, 3.9]", b"[3.2]"))
        assert wait_reported(store, good_id).status == "succeeded"
        assert all(t.is_alive() for t in host._threads)


def test_worker_killed_mid_shard_message_reappears(store, azurite, tmp_path, monkeypatch):
    """SIGKILL the worker running a shard: its lease lapses, the shard reruns, the job completes."""
    pipeline_env(monkeypatch, azurite.connection_string, tmp_path, UPWELL_LEASE_S="4")
    with running_host(azurite.connection_string, tmp_path):
        job_id = _upload(store, "e2e/kill/job.yaml",
                         b"payload: logistic\nparams: {steps: 200, burn_in: 10, sleep_s: 4}\ngrid: {r: [3.1]}\n")
        ledger = Ledger(store)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            shard = ledger.shard(job_id, "s00000")
            if shard and shard.status == "running":
                break
            time.sleep(0.2)
        else:
            raise AssertionError("the shard never started")
        victims = live_worker_pids(tmp_path)
        assert victims
        for pid in victims:
            kill(pid)
        job = wait_reported(store, job_id, 120)
        shard = ledger.shard(job_id, "s00000")
        assert job.status == "succeeded" and int(shard.attempts) >= 2
        result = json.loads(store.read(f"results/{job_id}/s00000.json"))
        assert result["status"] == "succeeded" and result["timings"]["attempt"] >= 2


def test_same_upload_delivered_twice_through_handler_is_one_job(store, azurite, tmp_path, monkeypatch):
    """Call the real ingest function twice with the SDK-type BlobClient the worker passes (a redelivery)."""
    from azure.storage.blob import BlobClient

    from upwell.local.devhost.app import load_functions

    pipeline_env(monkeypatch, azurite.connection_string, tmp_path)
    ingest = {s.name: s for s in load_functions("function_app:app")}["ingest"].func
    job_id = _upload(store, "e2e/twice/job.yaml", SWEEP)
    client = BlobClient.from_connection_string(azurite.connection_string, "incoming", "e2e/twice/job.yaml")
    for _ in range(2):
        ingest(client)
    rows = Ledger(store).shards(job_id)
    assert len(rows) == 4
    queued = store.queue(names.work_queue("cpu")).peek_messages(max_messages=32)
    assert sum(1 for m in queued if job_id in m.content) == 4
    store.queue(names.work_queue("cpu")).clear_messages()
