"""Cost per job, owner and project; estimates priced on the pool that runs and learned from past
results; budgets per owner and project; the wall-clock kill switch in the agent.

The pipeline test runs real jobs through the devhost and local agents on Azurite, then checks that
`upwell cost` totals equal the sum of the per-shard figures in the reports' summary.json."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tests.pipeline_helpers import module_azurite, pipeline_env, running_host, wait_reported
from upwell import cost, names
from upwell.cost import forecast as est
from upwell.cost.accounting import parse_since
from upwell.ingest.blobnames import job_id_for
from upwell.ingest.ingestor import Ingestor
from upwell.settings import Settings
from upwell.storage import Storage

SWEEP = """name: cost sweep
payload: logistic
owner: lead@lab.org
project: ocean
params: {{steps: 300, burn_in: 50, sleep_s: {sleep}}}
grid: {{r: [2.9, 3.5, 3.9]}}
estimate: {{node_seconds_per_shard: 50}}
spot: true
"""
SLOW = b"""name: runaway
payload: logistic
owner: bo
project: ocean
params: {steps: 300, burn_in: 50, sleep_s: 30}
grid: {r: [3.1]}
max_shard_wall_clock_s: 2
"""


# -- pure -------------------------------------------------------------------------------

def test_node_share_is_cpus_or_gpus_over_the_vm():
    assert cost.node_share("Standard_D4s_v5", cpus=2) == pytest.approx(0.5)
    assert cost.node_share("Standard_D2s_v5", cpus=8) == 1.0
    assert cost.node_share("Standard_NC6s_v3", cpus=1, gpus=1) == 1.0  # one V100 of one
    assert cost.node_share("Standard_NC6s_v3", cpus=3) == pytest.approx(0.5)
    assert cost.node_share("no-such-key") == 1.0


def test_blended_price_follows_the_pools_spot_share():
    row = cost.load().get("Standard_D4s_v5")
    assert cost.blended_per_hour("Standard_D4s_v5", 0.0) == row.payg
    assert cost.blended_per_hour("Standard_D4s_v5", 1.0) == row.spot
    assert cost.blended_per_hour("Standard_D4s_v5", 0.25) == pytest.approx(0.75 * row.payg + 0.25 * row.spot)


def test_estimate_prices_dedicated_nodes_when_the_pool_has_no_spot():
    """A spot-allowed job on a pool with spot_share 0 runs on dedicated nodes: price those."""
    points = [{"r": 3.0}, {"r": 3.5}]
    e = est.estimate(points, history=est.History(), manifest_s=100, price_key="Standard_D2s_v5",
                     spot_allowed=True, pool_spot_share=0.0, ranks=1)
    payg = cost.load().get("Standard_D2s_v5").payg
    assert e.spot_fraction == 0.0 and e.basis == "from the manifest"
    assert e.usd == pytest.approx(200 / 3600 * payg * 0.5)  # 1 of the D2s_v5's 2 vCPUs


def test_estimate_blends_the_manifest_with_results_by_count_and_size():
    """The manifest's figure weighs as 3 results; one of the same size as 1, one of another size as 0.25."""
    h = est.History(jobs=2)
    for s in (10.0, 12.0, 11.0):
        h.add(est.size_key({"nx": 16}, 2), s)
    h.add(est.size_key({"nx": 128}, 2), 40.0)
    same = h.per_shard(est.size_key({"nx": 16}, 2), 99)
    assert same.how == "size" and same.seconds == pytest.approx((3 * 99 + 3 * 11 + 0.25 * 40) / 6.25)
    assert same.low < same.seconds < same.high
    other = h.per_shard(est.size_key({"nx": 64}, 2), 99)  # four results of other sizes: 1.0 in all
    assert other.how == "payload" and other.seconds == pytest.approx((3 * 99 + 1.0 * 11.5) / 4.0)
    assert est.History().per_shard("x", 99) == est.PerShard(99.0, 99.0, 99.0, "manifest")
    many = est.History(by_size={"k": [20.0] * 297}, all=[20.0] * 297)
    assert many.per_shard("k", 1000).seconds == pytest.approx((3 * 1000 + 297 * 20) / 300)  # history wins, gently
    e = est.estimate([{"nx": 16}, {"nx": 128}, {"nx": 64}], history=h, manifest_s=99, price_key="Standard_D4s_v5",
                     spot_allowed=False, pool_spot_share=0.5, ranks=2)
    per = [h.per_shard(est.size_key(p, 2), 99).seconds for p in ({"nx": 16}, {"nx": 128}, {"nx": 64})]
    assert e.node_seconds == pytest.approx(sum(per)) and "3 of 3 shards" in e.basis
    assert e.usd_low < e.usd < e.usd_high
    assert est.size_key('{"nx": 16}', 2) == est.size_key({"nx": 16}, 2)  # ledger rows keep params as JSON


def test_parse_since():
    from datetime import UTC, datetime

    now = datetime(2026, 12, 1, tzinfo=UTC)
    assert parse_since("30d", now) == datetime(2026, 11, 1, tzinfo=UTC)
    assert parse_since("12h", now).hour == 12 and parse_since("2026-11-01", now).day == 1
    with pytest.raises(ValueError, match="30d"):
        parse_since("lately", now)


# -- through the pipeline ------------------------------------------------------------------

# The learned estimate must start from an empty ledger, not from other tests' logistic jobs.
azurite = module_azurite("cost")


@pytest.fixture
def store(azurite):
    s = Storage(azurite.connection_string)
    s.ensure()
    return s


def _upload(store: Storage, name: str, data: bytes, who: str = "") -> str:
    meta = {"uploaded_by": who} if who else None
    etag = store.blob(names.INCOMING, name).upload_blob(data, overwrite=True, metadata=meta)["etag"]
    return job_id_for(name, etag)


def _report_shard_usd(store: Storage, job_id: str) -> list[float]:
    summary = json.loads(store.read(f"{names.REPORTS}/{job_id}/summary.json"))
    return [r["cost_usd"] for r in summary["shards"] if r["cost_usd"] is not None], summary


def test_cost_totals_match_reports_and_estimates_learn(store, azurite, tmp_path, monkeypatch):
    pipeline_env(monkeypatch, azurite.connection_string, tmp_path, UPWELL_PROJECT="lab-default")
    with running_host(azurite.connection_string, tmp_path):
        first = _upload(store, "cost/a/job.yaml", SWEEP.format(sleep=0.5).encode())
        wait_reported(store, first)
        second = _upload(store, "cost/b/job.yaml", SWEEP.format(sleep=0.5).encode())
        wait_reported(store, second)
        runaway = _upload(store, "cost/c/job.yaml", SLOW, who="bo")
        killed = wait_reported(store, runaway, timeout=90)

    # The agent stopped the attempt at its wall-clock and did not retry it.
    shard = store.table(names.JOBS_TABLE).get_entity(runaway, "s00000")
    assert killed.status == "failed" and "max wall-clock of 2 s" in shard["error"]
    assert int(shard.get("failures") or 0) == 0 and float(shard["node_seconds"]) < 25

    usd, summaries = {}, {}
    for job in (first, second, runaway):
        usd[job], summaries[job] = _report_shard_usd(store, job)
    s1, s2 = summaries[first]["cost"], summaries[second]["cost"]
    assert s1["estimate_basis"] == "from the manifest"
    assert s2["estimate_basis"].startswith("learned") and "3 of 3 shards" in s2["estimate_basis"]
    assert s2["estimate_spot_fraction"] == 0.0 and s2["node_share"] == pytest.approx(0.5)
    # The second job's estimate learned from the first job's node time: it moved from the manifest's 50 s a
    # shard towards what the first job used. (Not each job's error against its own run: a loaded machine can
    # run the second job's shards far faster than the first's, which a learned estimate cannot know.)
    learned_from = s1["actual_node_seconds"]
    assert abs(s2["estimate_node_seconds"] - learned_from) < abs(s1["estimate_node_seconds"] - learned_from)
    assert s2["estimate_node_seconds"] < s1["estimate_node_seconds"]
    assert abs(s1["actual_usd"] - sum(usd[first])) < 1e-9

    runner = CliRunner()
    from upwell.cli import app

    def total(by: str) -> dict:
        out = runner.invoke(app, ["cost", "--by", by, "--since", "1d", "--json"], catch_exceptions=False)
        assert out.exit_code == 0, out.output
        return json.loads(out.output)

    by_job = {g["key"]: g for g in total("job")["groups"]}
    for job in (first, second, runaway):
        assert by_job[job]["actual_usd"] == pytest.approx(sum(usd[job]), rel=1e-9, abs=1e-12)
    owners = {g["key"]: g["actual_usd"] for g in total("owner")["groups"]}
    assert owners["lead@lab.org"] == pytest.approx(sum(usd[first]) + sum(usd[second]), rel=1e-9)
    assert owners["bo"] == pytest.approx(sum(usd[runaway]), rel=1e-9, abs=1e-12)
    projects = total("project")
    assert {g["key"] for g in projects["groups"]} >= {"ocean"}
    grand = sum(sum(v) for v in usd.values())
    assert sum(g["actual_usd"] for g in projects["groups"] if g["key"] == "ocean") == pytest.approx(grand, rel=1e-9)
    monkeypatch.setenv("COLUMNS", "200")
    table = runner.invoke(app, ["cost", "--by", "owner"], catch_exceptions=False).output
    assert "lead@lab.org" in table and "error" in table

    # A budget per owner: the lead has spent, so a job whose estimate would pass that budget is refused.
    monkeypatch.setenv("UPWELL_BUDGETS", json.dumps({"owner": {"lead@lab.org": owners["lead@lab.org"] + 1e-6}}))
    name = "cost/d/job.yaml"
    _upload(store, name, SWEEP.format(sleep=0.5).encode())
    outcome = Ingestor(store, Settings.from_env()).ingest(name)
    assert outcome.status == "rejected" and "owner 'lead@lab.org'" in outcome.message and "budget" in outcome.message
