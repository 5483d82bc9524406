"""`upwell submit` checks before it uploads (on Azurite, through the CLI): a misspelt payload or field is
refused with nothing uploaded and a hint at the field meant; --dry-run prints the estimate only;
--wait watches the job through the real devhost to its report."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tests.pipeline_helpers import azurite_in, pipeline_env, running_host
from upwell import logs, names
from upwell.cli import app
from upwell.storage import Storage

runner = CliRunner()
# Log to pytest's stderr, not to a CliRunner stream that closes after the first command.
logs.configure()


def _folder(tmp_path, name: str, manifest: str, data: dict[str, str] | None = None):
    folder = tmp_path / name
    (folder / "data").mkdir(parents=True)
    (folder / "job.yaml").write_text(manifest)
    for fname, text in (data or {}).items():
        (folder / "data" / fname).write_text(text)
    return folder


def _cli(*args: str):
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


def _uploaded(store: Storage, prefix: str) -> list[str]:
    return [b.name for b in store.list(names.INCOMING, prefix)]


@pytest.mark.parametrize(("manifest", "expect"), [
    ("payload: logistc\ngrid: {r: [3.1]}\n", "unknown payload 'logistc'"),
    ("payload: logistic\nbudget: 5\ngrid: {r: [3.1]}\n",
     "budget: Extra inputs are not permitted; did you mean budget_usd?"),
    ("payload: logistic\nresources: {rank: 2}\n",
     "resources.rank: Extra inputs are not permitted; did you mean ranks?"),
    ("payload: logistic\ngrid: {step: [100]}\n", "did you mean steps?"),
    ("payload: logistic\npool: gpus\n", "pool 'gpus' is not configured"),
    ("payload: logistic\nbudget_usd: 0.000001\ngrid: {r: [3.1, 3.2]}\n", "exceeds the budget"),
    ("payload: channel-stats\ndata: [data/missing.csv]\n", "data[0] 'data/missing.csv' is neither among the files"),
])
def test_a_bad_manifest_is_refused_before_any_upload(store, tmp_path, manifest, expect):
    prefix = f"check/bad-{abs(hash(manifest))}"
    folder = _folder(tmp_path, "bad", manifest, {"other.csv": "t,a\n1,2\n"})
    code, out = _cli("submit", str(folder), "--prefix", prefix)
    assert code != 0, out
    assert "refused" in out and "nothing uploaded" in out and expect in out.replace("\n", " "), out
    assert _uploaded(store, prefix) == []


def test_dry_run_counts_shards_and_prints_the_estimate_without_uploading(store, tmp_path):
    rows = "t,a,b\n" + "".join(f"{i},{i * 0.5},{i % 3}\n" for i in range(25))
    folder = _folder(tmp_path, "stats", "payload: channel-stats\ndata: [data/run.csv]\nshard: {rows: 10}\n"
                     "estimate: {node_seconds_per_shard: 60}\n", {"run.csv": rows})
    code, out = _cli("submit", str(folder), "--prefix", "check/dry", "--dry-run")
    assert code == 0, out
    assert "ok incoming/check/dry/stats/job.yaml: channel-stats on pool cpu, 3 shard(s); estimate 180 node-s = $" in \
        out, out
    assert "dry run: nothing uploaded" in out
    assert _uploaded(store, "check/dry") == []


def test_dry_run_counts_a_parquet_files_shards_from_its_footer(store, tmp_path):
    """A Parquet file's shards are its row groups, grouped as ingest groups them (``group_rows``): 7 row groups
    of 4 rows at ``rows: 10`` make 4 shards (8, 8, 8, 4 rows); a file that is not Parquet is refused by name."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from upwell.ingest.parquetshards import group_rows

    folder = _folder(tmp_path, "pq", "payload: channel-stats\ndata: [data/run.parquet]\nshard: {rows: 10}\n"
                     "estimate: {node_seconds_per_shard: 60}\n")
    table = pa.table({"t": list(range(28)), "a": [i * 0.5 for i in range(28)]})
    pq.write_table(table, folder / "data" / "run.parquet", row_group_size=4)
    assert [rows for _, _, rows in group_rows([4] * 7, 10)] == [8, 8, 8, 4]
    code, out = _cli("submit", str(folder), "--prefix", "check/pq", "--dry-run")
    assert code == 0, out
    assert "channel-stats on pool cpu, 4 shard(s); estimate 240 node-s" in out, out
    (folder / "data" / "run.parquet").write_bytes(b"t,a\n1,2\n")
    code, out = _cli("submit", str(folder), "--prefix", "check/pq")
    assert code != 0 and "incoming/check/pq/pq/data/run.parquet is not a readable Parquet file" in \
        out.replace("\n", " "), out
    assert _uploaded(store, "check/pq") == []


@pytest.fixture
def own_azurite(tmp_path):
    """Its own Azurite: on the session's, the work earlier tests left queued or open is this host's backlog too, and
    its workers ran that first (six times as long), which says nothing about --wait. Its containers, queues and
    tables made as `upwell up` makes them."""
    for emulator in azurite_in(tmp_path / "azurite"):
        Storage(emulator.connection_string).ensure()
        yield emulator


def test_wait_follows_the_job_to_its_report(own_azurite, tmp_path, monkeypatch):
    connection = own_azurite.connection_string
    pipeline_env(monkeypatch, connection, tmp_path)
    folder = _folder(tmp_path, "waited",
                     "payload: logistic\nparams: {steps: 200, burn_in: 10}\ngrid: {r: [3.2, 3.5]}\n")
    import handlers.context

    handlers.context.settings()  # configures logging now, not on a host thread while the CLI's stderr is swapped
    with running_host(connection, tmp_path):
        code, out = _cli("submit", str(folder), "--prefix", "check/wait", "--wait", "--timeout", "120")
    assert code == 0, out
    assert "estimate" in out and "uploaded" in out
    assert out.strip().splitlines()[-1].endswith(": succeeded"), out


# Cloud pools as UPWELL_POOLS names them: a one-node-per-shard VMSS pool (Standard_D4s_v5: 4 cores), an ACI
# pool, and the pools that can run gangs; a setting that names a cloud pool is the whole pool set.
VMSS = {"backend": "vmss", "max_nodes": 8, "price_key": "Standard_D4s_v5", "vm_size": "Standard_D4s_v5"}
ACI = {"backend": "aci", "max_nodes": 8, "price_key": "Standard_D4s_v5", "options": {"cores_per_node": 4}}
SLURM = {"backend": "slurm", "max_nodes": 2, "options": {"cores_per_node": 4}}
BATCH = {"backend": "batch", "max_nodes": 16, "price_key": "Standard_HB120rs_v3", "vm_size": "Standard_HB120rs_v3",
         "options": {"gangs": True}}


def _pools(monkeypatch, **pools) -> None:
    import json

    monkeypatch.setenv("UPWELL_POOLS", json.dumps(pools))


@pytest.mark.parametrize(("pools", "manifest", "expect"), [
    ({"cpu": VMSS, "aci": ACI, "hpc": SLURM, "big": BATCH}, "pool: cpu\nresources: {nodes: 2}\n",
     "GangUnsupported: incoming/check/shape/job/job.yaml: pool 'cpu' (vmss) runs one node per shard; a shard of 2 "
     "nodes needs a pool whose backend is one of slurm, batch; pools that can run it: big, hpc"),
    ({"cpu": VMSS, "aci": ACI, "hpc": SLURM, "big": BATCH}, "pool: aci\nresources: {nodes: 4}\n",
     "GangUnsupported: incoming/check/shape/job/job.yaml: pool 'aci' (aci) runs one node per shard; a shard of 4 "
     "nodes needs a pool whose backend is one of slurm, batch; pools that can run it: big (set `pool:`"),
    ({"cpu": VMSS, "aci": ACI}, "pool: aci\nresources: {nodes: 2}\n",
     "; no slurm or batch pool is configured (UPWELL_POOLS)"),
    ({"cpu": VMSS, "hpc": SLURM}, "pool: cpu\nresources: {nodes: 3}\n",
     "no configured pool can run it: the slurm/batch pools (hpc) refuse it too"),
    ({"cpu": VMSS, "hpc": SLURM}, "pool: hpc\nresources: {nodes: 3}\n",
     "TooManyNodes: incoming/check/shape/job/job.yaml: the shard asks for 3 nodes; pool 'hpc' has at most 2"),
    ({"cpu": VMSS, "aci": ACI}, "pool: cpu\nresources: {ranks: 6}\n",
     "Oversubscribed: incoming/check/shape/job/job.yaml: 6 ranks per node but a node of pool 'cpu' has 4 cores"),
    ({"cpu": VMSS, "aci": ACI}, "pool: aci\nresources: {ranks_per_node: 8}\n",
     "Oversubscribed: incoming/check/shape/job/job.yaml: 8 ranks per node but a node of pool 'aci' has 4 cores"),
])
@pytest.mark.parametrize("dry_run", [True, False])
def test_a_shape_the_pool_cannot_run_is_refused_before_any_upload(store, tmp_path, monkeypatch, pools, manifest,
                                                                    expect, dry_run):
    """What ingest would refuse (upwell.shape), refused by `upwell submit` and its --dry-run plan with the
    named error; a GangUnsupported names the configured pools that can run the shard."""
    _pools(monkeypatch, **pools)
    folder = _folder(tmp_path, "job", f"payload: logistic\n{manifest}grid: {{r: [3.1, 3.2]}}\n")
    code, out = _cli("submit", str(folder), "--prefix", "check/shape", *(["--dry-run"] if dry_run else []))
    assert code == 2, out
    assert "refused (nothing uploaded)" in out and expect in " ".join(out.split()), out
    assert _uploaded(store, "check/shape") == []


def test_a_shape_the_pool_can_run_is_planned_in_nodes(store, tmp_path, monkeypatch):
    """Two shards of 2 nodes on the Slurm pool, and 6 ranks on a 4-core VMSS node when oversubscribe is said:
    both pass; the plan names the nodes and its estimate is 2 x one node's seconds per shard."""
    _pools(monkeypatch, cpu=VMSS, hpc=SLURM)
    gang = _folder(tmp_path, "gang", "payload: logistic\npool: hpc\nresources: {nodes: 2, ranks_per_node: 2}\n"
                   "estimate: {node_seconds_per_shard: 60}\ngrid: {r: [3.1, 3.2]}\n")
    code, out = _cli("submit", str(gang), "--prefix", "check/fits", "--dry-run")
    assert code == 0, out
    assert "on pool hpc, 2 shard(s) of 2 nodes each; estimate 240 node-s" in " ".join(out.split()), out
    over = _folder(tmp_path, "over", "payload: logistic\npool: cpu\nresources: {ranks: 6, oversubscribe: true}\n"
                   "grid: {r: [3.1]}\n")
    code, out = _cli("submit", str(over), "--prefix", "check/fits", "--dry-run")
    assert code == 0, out
    assert _uploaded(store, "check/fits") == []
