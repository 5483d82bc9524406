"""One estimate for `upwell submit --dry-run` and ingest (issue 25 item 8), on Azurite.

Three finished shards of one size are in the ledger. The estimate blends them with the manifest's figure
(the manifest as three results of the same size, a result of another size as a quarter of one), and the
dry run prints the same node-seconds, dollars and range that ingest then records on the job row."""

from __future__ import annotations

import json
import re
import uuid

import pytest
import yaml
from typer.testing import CliRunner

from tests.pipeline_helpers import ingest_manifest
from upwell import logs
from upwell.cli import app
from upwell.ledger import JobRow, Ledger, ShardRow
from upwell.payloads.registry import Registry
from upwell.rows import JobState, ShardState
from upwell.settings import Settings
from upwell.storage import Storage
from upwell.timeutil import now_iso

logs.configure()  # to pytest's stderr, not to a CliRunner stream that closes after the command
PRINTED = re.compile(r"estimate (\d+) node-s = \$([0-9.]+) \(range \$([0-9.]+)-\$([0-9.]+)\)")


def _definition(name: str) -> bytes:
    return yaml.safe_dump({"schema": 1, "name": name, "version": "1.0.0", "owner": "a test lab",
                           "image": "labcr.azurecr.io/tools/est@sha256:" + "3c" * 32,
                           "params": {"n": {"type": "int", "default": 1}},
                           "command": ["{python}", "-c", "print({n})"]}).encode()


def test_dry_run_and_ingest_give_the_same_blended_estimate_and_range(storage_env, tmp_path):
    store = Storage(storage_env)
    store.ensure()
    payload = f"est-{uuid.uuid4().hex[:8]}"  # its own history: no other test's results
    Registry(store, Settings().registry_allowlist).push(_definition(payload), f"{payload}.yaml")
    earlier = f"hist-{payload}"
    ledger = Ledger(store)
    ledger.create_job(JobRow(job_id=earlier, status=JobState.SUCCEEDED, payload=payload, pool="cpu",
                             finished_at=now_iso(), ranks=1, nodes=1))
    ledger.add_shards(earlier, [ShardRow(job_id=earlier, shard_id=f"s{i:05d}", status=ShardState.SUCCEEDED,
                                         params=json.dumps({"n": 1}), node_seconds=s)
                                for i, s in enumerate((100.0, 120.0, 140.0))])
    manifest = f"payload: {payload}\nestimate: {{node_seconds_per_shard: 10}}\ngrid: {{n: [1, 2]}}\n"
    (tmp_path / "blend").mkdir()
    (tmp_path / "blend" / "job.yaml").write_text(manifest)

    out = CliRunner().invoke(app, ["submit", "--dry-run", str(tmp_path / "blend")])
    assert out.exit_code == 0, out.output
    found = PRINTED.search(" ".join(out.output.split()))
    assert found, out.output
    node_s, usd, low, high = int(found[1]), float(found[2]), float(found[3]), float(found[4])
    # n=1: (3 x 10 + 3 x 120) / 6 = 65; n=2 (another size): (3 x 10 + 0.75 x 120) / 3.75 = 32
    assert node_s == 97 and low < usd < high and "learned from 1 earlier job(s) for 2 of 2 shards" in out.output

    job = ledger.job(ingest_manifest(store, f"blend/{payload}/job.yaml", manifest))
    assert job.estimate_node_seconds == pytest.approx(97.0)
    assert f"{job.estimate_usd:.4f}" == f"{usd:.4f}" and f"range ${low:.4f}-${high:.4f}" in job.estimate_basis
