"""The two samples' reduce definitions run as a worker runs them (workers.launch.run_payload over a staged
results folder): the heat sweep's order fit and the GROMACS sweep's one curve. And a payload definition's
``reduce:``: every job's default, which a manifest's own overrides."""

from __future__ import annotations

import json
import uuid

import pytest
import yaml

from tests.pipeline_helpers import ingest_manifest
from upwell.after.spec import ReduceSpec, of_job
from upwell.ledger import Ledger
from upwell.messages import WorkItem
from upwell.payloads import schema
from upwell.payloads.registry import Registry
from upwell.settings import Settings
from upwell.storage import Storage
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


def test_a_definitions_reduce_is_the_default_and_a_manifests_overrides_it(storage_env):
    store = Storage(storage_env)
    store.ensure()
    name = f"swept-{uuid.uuid4().hex[:6]}"
    doc = {"schema": 1, "name": name, "version": "1.0.0", "owner": "a test lab",
           "image": "labcr.azurecr.io/tools/swept@sha256:" + "5e" * 32, "params": {"n": {"type": "int", "default": 1}},
           "command": ["{python}", "-c", "print({n})"], "reduce": {"payload": "heat-order", "artifacts": ["*.csv"]}}
    Registry(store, Settings().registry_allowlist).push(yaml.safe_dump(doc).encode(), f"{name}.yaml")
    assert "reduce" in json.loads(schema.PATH.read_text())["properties"]  # the published schema carries it
    default = ingest_manifest(store, f"{name}/a/job.yaml", f"payload: {name}\ngrid: {{n: [1, 2]}}\n")
    own = ingest_manifest(store, f"{name}/b/job.yaml", f"payload: {name}\nreduce: {{payload: gromacs-curve}}\n")
    ledger = Ledger(store)
    assert of_job(ledger.job(default)).reduce == ReduceSpec(payload="heat-order", artifacts=["*.csv"])
    assert of_job(ledger.job(own)).reduce == ReduceSpec(payload="gromacs-curve")
