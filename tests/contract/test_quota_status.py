"""Contract test: a quota refusal from the real Batch SDK path reaches `upwell status` within one
scale interval (one Autoscaler.adapt), on real Azurite."""

from __future__ import annotations

from tests.contract.test_batch_contract import ARM_POOL, A, R, spec
from upwell.ledger import JobRow, JobState, Ledger, ShardRow, ShardState
from upwell.results.status import job_status
from upwell.scale.autoscaler import Autoscaler
from upwell.settings import Settings
from upwell.storage import Storage


def test_contract_quota_error_shows_on_job_status_after_one_interval(server, credential, client_kwargs, azurite):
    store = Storage(azurite.connection_string)
    store.ensure()
    ledger = Ledger(store)
    ledger.create_job(JobRow(job_id="quota-job", status=JobState.ACCEPTED, pool="gpu", shards_total=1,
                             created_at="2026-11-30T00:00:00Z"))
    ledger.add_shards("quota-job", [ShardRow(job_id="quota-job", shard_id="s00000", status=ShardState.QUEUED,
                                             pool="gpu")])
    store.queue("work-gpu").send_message('{"placeholder": true}')
    server.route("GET", r"/pools/upwell-gpu", R(404, {"code": "PoolNotFound", "message": {"value": "no"}}))
    server.route("PUT", ARM_POOL, A("QuotaExceeded", "Operation could not be completed as it results in exceeding "
                                    "approved standardNCSv3Family Cores quota. Current Limit: 0", 409))
    gpu = spec(server, name="gpu")
    settings = Settings(pools={"gpu": gpu})
    scaler = Autoscaler(store, settings, credential=credential, client_kwargs=client_kwargs)
    try:
        decision = scaler.adapt()["gpu"]
        assert decision.target >= 1
        status = job_status(store, "quota-job")
        assert "quota" in status["message"].lower() and "gpu" in status["message"]
        assert any(r.method == "PUT" for r in server.requests)
    finally:
        store.queue("work-gpu").clear_messages()
        ledger.update_job("quota-job", status="failed")
