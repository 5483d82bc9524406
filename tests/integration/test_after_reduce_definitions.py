"""The two samples' reduce definitions run as a worker runs them (workers.launch.run_payload over a staged
results folder): the heat sweep's order fit and the GROMACS sweep's one curve."""

from __future__ import annotations

import json

import pytest

from upwell.messages import WorkItem
from upwell.payloads.registry import Registry
from workers.launch import run_payload

pytestmark = pytest.mark.afterjob


def _reduce(tmp_path, payload: str, docs: dict[str, dict]):
    folder = tmp_path / "input"
    folder.mkdir()
    for name, doc in docs.items():
        (folder / f"{name}.json").write_text(json.dumps(doc))
    loaded = Registry().resolve(payload)
    item = WorkItem(job_id="sweep-reduce1", shard_id="reduce", payload=payload, pool="cpu",
                    input_blob="results/sweep/", payload_version=loaded.definition.version,
                    payload_sha256=loaded.sha256)
    return run_payload(item, tmp_path / "work", input_path=folder)


def test_gromacs_sweep_reduces_to_one_curve(tmp_path):
    docs = {f"s{i}": {"status": "succeeded", "params": {"temperature": t},
                      "metrics": {"potential_per_molecule": -41.5 + 0.05 * (t - 280)}}
            for i, t in enumerate([280, 300, 320, 340, 360])}
    docs["s9"] = {"status": "failed", "params": {"temperature": 400}, "metrics": {}}
    result = _reduce(tmp_path, "gromacs-curve", docs)
    assert result.status == "succeeded", result.stderr_tail
    assert result.metrics["points"] == 5 and abs(result.metrics["dU_dT_kj_per_mol_k"] - 0.05) < 1e-9
    names = sorted(p.name for p in result.artifacts)
    assert "potential_curve.png" in names and "curve.csv" in names
    csv = (tmp_path / "work" / "out" / "curve.csv").read_text().splitlines()
    assert csv[0] == "temperature,potential_per_molecule" and len(csv) == 6


def test_heat_order_definition_refuses_a_sweep_of_one_grid(tmp_path):
    docs = {"s0": {"status": "succeeded", "params": {"nx": 16}, "metrics": {"l2_error": 1e-4}}}
    result = _reduce(tmp_path, "heat-order", docs)
    assert result.status == "failed" and result.permanent and result.exit_code == 65
