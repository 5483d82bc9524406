"""upwell simulate with a Slurm pool: agents are jobs on a fixed cluster, so no boot time is billed
and the pool never grows past the cluster's node count."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from upwell.errors import ConfigError
from upwell.scale.comparison import run
from upwell.scale.traces import Trace, load_trace


def trace(**kw) -> Trace:
    base = Trace(name="t", description="", arrivals=({"at_min": 0, "count": 20, "duration_min": 2},),
                 max_nodes=5, price_per_node_hour=1.0, spot_price_per_node_hour=0.2, boot_median_min=3,
                 boot_sigma=0.0, boot_min_min=3, boot_max_min=3)
    return replace(base, **kw)


@pytest.mark.parametrize("policy", ["upwell", "batch-formula"])
def test_slurm_pool_has_no_boot_cost_and_a_fixed_node_count(policy):
    cloud = run(trace(), policy, 0)
    slurm = run(trace(), policy, 0, backend="slurm")
    assert cloud.boot_node_min > 0 and slurm.boot_node_min == 0
    assert slurm.completed == cloud.completed == 20
    assert slurm.peak_nodes <= 5 and slurm.lost_task_min == 0
    assert slurm.makespan_min < cloud.makespan_min
    if policy == "upwell":  # Batch's formula holds idle nodes for its 5-minute interval either way
        assert slurm.cost_usd < cloud.cost_usd


def test_slurm_makespan_is_the_work_over_the_fixed_nodes():
    # 20 two-minute tasks on 5 nodes that are already up: 4 waves, 8 minutes from the first arrival.
    r = run(trace(), "upwell", 0, backend="slurm")
    assert r.makespan_min == pytest.approx(8.0, abs=0.6)
    assert run(trace(max_nodes=10), "upwell", 0, backend="slurm").makespan_min == pytest.approx(4.0, abs=0.6)


def test_backend_from_the_trace_file_and_a_bad_one_is_named(tmp_path):
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"name": "cluster", "pool": {"backend": "slurm", "max_nodes": 4},
                                "arrivals": [{"at_min": 0, "count": 8, "duration_min": 1}]}))
    loaded = load_trace(path)
    assert loaded.backend == "slurm" and run(loaded, "upwell", 0).boot_node_min == 0
    with pytest.raises(ConfigError, match="backend"):
        run(trace(), "upwell", 0, backend="pbs")


def test_cli_models_a_slurm_pool(tmp_path):
    from upwell.cli import app

    res = CliRunner().invoke(app, ["simulate", "burst", "--backend", "slurm", "--pool-max", "10",
                                   "--out", str(tmp_path), "--no-plots", "-p", "upwell"])
    assert res.exit_code == 0, res.output
    assert "slurm" in res.output
    (row,) = json.loads((tmp_path / "summary.json").read_text())
    assert row["boot_node_min"] == 0 and row["completed"] == 500 and row["peak_nodes"] <= 10
