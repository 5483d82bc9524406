"""The report's scaling view: the nodes line follows the workers that ran the job's shards, "max backlog" is
the job's own, a SKU's worked example stays out of unrelated reports, and local pools are priced as the VM
sizes the Bicep templates deploy by default."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.unit.test_report import JOB, at, build, result_doc, shard_row, typed
from upwell import cost
from upwell.results.report.model import merge
from upwell.results.report.summary import cost_summary, scale_points, scaling
from upwell.rows import JobRow
from upwell.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def _job(**extra) -> dict:
    return {"PartitionKey": JOB, "RowKey": "job", "status": "succeeded", "payload": "logistic", "pool": "cpu",
            "shards_total": 3, "created_at": at(-1), "finished_at": at(70), "price_key": "Standard_D4s_v5", **extra}


def _rows() -> list[dict]:
    return [shard_row("s-00", "succeeded", "node-a", 0, 2, 40), shard_row("s-01", "succeeded", "node-b", 0, 3, 45),
            shard_row("s-02", "succeeded", "node-a", 0, 41, 60)]


# One decision, recorded before the pool grew (nodes 0); another job keeps the pool's backlog at 10.
EVENTS = [{"pool": "cpu", "ts": at(0), "target": 2, "nodes": 0, "visible": 9, "in_flight": 1, "reason": "backlog",
           "capped_by": "", "message": ""}]


def test_the_nodes_line_follows_the_workers_running_the_jobs_shards():
    views = merge(typed(_rows()), [])
    points = scale_points(EVENTS, views)
    by_time = {p["ts"].isoformat().replace("+00:00", "Z"): p for p in points}
    assert by_time[at(0)]["nodes"] == 0
    assert by_time[at(3)]["nodes"] == 2  # both workers run a shard
    assert by_time[at(45)]["nodes"] == 1 and by_time[at(60)]["nodes"] == 0
    assert [p["decision"] for p in points].count(True) == 1
    s = scaling(EVENTS, views)
    assert s["events"] == 1 and s["pools"]["cpu"]["max_nodes"] == 2


def test_max_backlog_is_the_jobs_own_and_the_pools_is_shown_apart():
    s = scaling(EVENTS, merge(typed(_rows()), []))["pools"]["cpu"]
    assert s["max_backlog"] == 3 and s["max_pool_backlog"] == 10
    files = build(_job(), _rows(), [result_doc(r) for r in _rows()], EVENTS, fetch=lambda _: b"")
    html = files["index.html"].decode()
    assert "max backlog (this job)" in html and "max pool backlog (all jobs)" in html
    assert json.loads(files["summary.json"])["scaling"]["pools"]["cpu"]["max_backlog"] == 3


def test_a_skus_worked_example_is_not_on_an_unrelated_report():
    table = cost.load()
    for key in ("Standard_NC6s_v3", "Standard_D32s_v4"):
        note = cost_summary(JobRow.from_entity(_job(price_key=key)), merge(typed(_rows()), []), table)["azure"]["note"]
        assert "ResNet" not in note and "GROMACS" not in note and "Quoted" not in note, note
    html = build(_job(price_key="Standard_NC6s_v3", payload="train-torch"), _rows(),
                        [result_doc(r) for r in _rows()], EVENTS, fetch=lambda _: b"")["index.html"].decode()
    assert "ResNet" not in html and "ImageNet" not in html
    assert "ResNet" in json.loads((ROOT / "upwell/cost/prices.json").read_text())["skus"]["Standard_NC6s_v3"][
        "example"]  # the quoted figure is kept as data


def test_local_pools_are_priced_as_the_bicep_default_vm_sizes():
    text = (ROOT / "bicep/main.bicep").read_text()
    defaults = {pool: re.search(rf"^param {pool}VmSize string = '([^']+)'", text, flags=re.M)[1]
                for pool in ("cpu", "mpi", "gpu")}
    pools = Settings.from_env({}).pools
    assert {name: pools[name].price_key for name in defaults} == defaults
    for key in defaults.values():
        assert key in cost.load(), f"{key} is not in the price table"
