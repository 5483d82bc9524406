"""A sweep in blocks of points, end to end on Azurite (issue 24): ingest makes one shard per block, a real agent runs
each block's points in turn (a failing point retried alone, one failing for good poisons its block only after its
retries), collect counts the blocks, and the report and status show points: one row per point, the failed ones
with their errors, the succeeded ones with their metrics."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import yaml

from tests.pipeline_helpers import module_azurite
from upwell import names
from upwell.ingest.ingestor import Ingestor
from upwell.ledger import Ledger
from upwell.ops.dashboard import job_line
from upwell.results.collect import collect
from upwell.results.points import expand_row
from upwell.results.publish import publish
from upwell.results.status import job_status
from upwell.settings import Settings
from upwell.storage import Storage
from workers.agent import Agent, AgentConfig

# its own Azurite: the estimate below is the manifest's alone, with no other test's logistic jobs as history
azurite = module_azurite("blocks")

# grid order: the last key runs fastest, so blocks of 3 are [(0, 3.2), (0, 3.5), (1, 3.2)] and
# [(1, 3.5), (100, 3.2), (100, 3.5)]: a point that fails its first attempt in each, two that always fail in the second
MANIFEST = {"name": "blocks", "payload": "logistic", "points_per_item": 3,
            "params": {"steps": 20, "burn_in": 0}, "grid": {"fail_first_attempts": [0, 1, 100], "r": [3.2, 3.5]},
            "estimate": {"node_seconds_per_shard": 2}}


def test_a_sweep_in_blocks_is_run_point_by_point_and_reported_with_a_row_per_point(azurite, tmp_path, monkeypatch):
    monkeypatch.setenv("UPWELL_WARM_RUNNER", "1")
    store = Storage(azurite.connection_string)
    store.ensure()
    store.queue(names.work_queue("cpu")).clear_messages()
    store.write(f"{names.INCOMING}/blocks-it/job.yaml", yaml.safe_dump(MANIFEST).encode())
    job_id = Ingestor(store, Settings()).ingest("blocks-it/job.yaml").job_id
    ledger = Ledger(store)
    job = ledger.job(job_id)
    assert (job.shards_total, job.points_total, job.points_per_item) == (2, 6, 3)
    assert job.estimate_node_seconds == 12 and job.estimate_node_seconds_per_shard == 6  # per point x points
    rows = sorted(ledger.shards(job_id), key=lambda r: r.shard_id)
    assert [len(r.block()) for r in rows] == [3, 3] and rows[1].block()[0] == {"fail_first_attempts": 1, "r": 3.5}

    config = AgentConfig(pool="cpu", node_id="blocks-1", idle_exit_s=1.5, poll_s=0.1, slots=2, max_dequeue_count=2,
                         retry_backoff_s=0.1, scratch=str(tmp_path))
    Agent(store, config, Settings()).run()
    done = [collect(store, f"{job_id}/{r.shard_id}.json", ledger) for r in rows]
    assert all(c is not None and c.counted for c in done) and sum(c.job_done for c in done) == 1

    first = json.loads(store.read(f"{names.RESULTS}/{job_id}/s00000.json"))
    assert first["status"] == "succeeded"
    assert [e["attempt"] for e in first["points"]] == [1, 1, 2]  # the retry ran only the point that had failed
    second = json.loads(store.read(f"{names.RESULTS}/{job_id}/s00001.json"))
    assert second["status"] == "failed" and second["poisoned"]
    assert [e["status"] for e in second["points"]] == ["succeeded", "failed", "failed"]

    # the dashboard's job view reads rows only: the block's failed points are on its row (collect wrote them)
    viewed = [p for r in sorted(ledger.shards(job_id), key=lambda r: r.shard_id) for p in expand_row(r)]
    assert [(p.shard_id, p.status.value) for p in viewed[3:]] == [
        ("s00001.p0", "succeeded"), ("s00001.p1", "failed"), ("s00001.p2", "failed")]
    assert viewed[4].parameters() == {"steps": 20, "burn_in": 0, "fail_first_attempts": 100, "r": 3.2}
    assert job_line(ledger.job(job_id), None, datetime.now(UTC))["points"]["total"] == 6
    status = job_status(store, job_id, ledger)
    assert status["status"] == "partially_failed" and status["points"] == {"total": 6, "done": 6, "per_item": 3}
    assert publish(store, job_id, ledger).built
    summary = json.loads(store.read(f"{names.REPORTS}/{job_id}/summary.json"))
    by_id = {s["shard_id"]: s for s in summary["shards"]}
    assert sorted(by_id) == [f"s0000{b}.p{j}" for b in (0, 1) for j in range(3)]
    assert [by_id[f"s00001.p{j}"]["status"] for j in range(3)] == ["succeeded", "failed", "failed"]
    assert by_id["s00000.p1"]["params"]["r"] == 3.5 and by_id["s00000.p1"]["status"] == "succeeded"
    failed = {f["shard_id"]: f for f in summary["failures"]}
    assert sorted(failed) == ["s00001.p1", "s00001.p2"] and "exit code 1" in failed["s00001.p2"]["error"]
    assert "s00001.p2" in store.read(f"{names.REPORTS}/{job_id}/index.html").decode()
