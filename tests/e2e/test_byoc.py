"""Bring your own code: a second real tool (Debian's sqlite3) by a definition file alone.

Push the definition with ``upwell payload push``, upload a data manifest, and the running
pipeline (real function_app on the devhost, local workers, Azurite) shards the CSV, runs
sqlite3 on each shard, and writes a report with the definition's table. No code change and
nothing restarted. Also: the push rules (immutable versions, no shadowing a built-in, the
registry allowlist), and the demo's one line for a missing tool.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.pipeline_helpers import pipeline_env, running_host, wait_reported
from upwell import names
from upwell.cli import app
from upwell.ingest.blobnames import job_id_for
from upwell.payloads.registry import builtins
from upwell.storage import Storage

DIGEST = "sha256:" + "5e" * 32
DEFINITION = r"""
schema: 1
name: sqlite-column-stats
version: 0.1.0
owner: a test lab
description: Row count, mean, min and max of one column of a CSV shard, by the sqlite3 shell.
image: labcr.azurecr.io/tools/sqlite3@<DIGEST>
pool: cpu
params:
  column: {type: str, default: temp, pattern: "[A-Za-z_][A-Za-z0-9_]{0,63}"}
input: {required: true, path: input/shard.csv}
command: [sqlite3, -line, ":memory:", -cmd, ".import --csv {input} t",
          "SELECT count(*) AS rows, avg({column}) AS mean, min(CAST({column} AS REAL)) AS lo,
           max(CAST({column} AS REAL)) AS hi FROM t"]
outputs:
  metrics_regex: {rows: '^\s*rows = (\d+)$', mean: '^\s*mean = (\S+)$', lo: '^\s*lo = (\S+)$',
                  hi: '^\s*hi = (\S+)$'}
report:
  table: [rows, mean, lo, hi]
""".replace("<DIGEST>", DIGEST)


@pytest.fixture(scope="module")
def sqlite3() -> str:
    found = shutil.which("sqlite3")
    if found is None:
        pytest.fail("sqlite3 is not installed: apt-get install sqlite3 (Debian/Ubuntu)", pytrace=False)
    return found


def _cli(*args: str):
    try:
        return CliRunner().invoke(app, list(args), catch_exceptions=False)
    finally:
        # Logging configured during the call writes to CliRunner's stream, closed once it returns;
        # point it back at the real stderr so later tests can log.
        from upwell import logs

        logs.configure()


def test_a_second_tool_by_a_definition_alone(sqlite3, azurite, tmp_path, monkeypatch):
    store = Storage(azurite.connection_string)
    store.ensure()
    pipeline_env(monkeypatch, azurite.connection_string, tmp_path)
    path = tmp_path / "sqlite-column-stats.yaml"
    path.write_text(DEFINITION)
    values = [round(0.37 * i - 5.0, 3) for i in range(100)]
    csv = "time,temp\n" + "".join(f"{i * 0.1:.1f},{v}\n" for i, v in enumerate(values))
    manifest = b"payload: sqlite-column-stats\ndata: [data/readings.csv]\nshard: {rows: 40}\nparams: {column: temp}\n"
    with running_host(azurite.connection_string, tmp_path):
        pushed = _cli("payload", "push", str(path))
        assert pushed.exit_code == 0 and "registered: sqlite-column-stats@0.1.0" in pushed.output, pushed.output
        listed = _cli("payload", "list")
        assert any(line.split()[:3] == ["sqlite-column-stats", "0.1.0", "registered"]
                   for line in listed.output.splitlines()), listed.output
        store.blob(names.INCOMING, "byo/sqlite/data/readings.csv").upload_blob(csv.encode(), overwrite=True)
        etag = store.blob(names.INCOMING, "byo/sqlite/job.yaml").upload_blob(manifest, overwrite=True)["etag"]
        job = wait_reported(store, job_id_for("byo/sqlite/job.yaml", etag), timeout=180)
    assert job.status == "succeeded" and job.shards_done == 3, job
    docs = [json.loads(store.read(f"results/{job.job_id}/s0000{i}.json")) for i in range(3)]
    assert [d["metrics"]["rows"] for d in docs] == [40, 40, 20]
    total = sum(d["metrics"]["mean"] * d["metrics"]["rows"] for d in docs)
    assert abs(total / 100 - sum(values) / 100) < 1e-9
    assert min(d["metrics"]["lo"] for d in docs) == min(values) and max(d["metrics"]["hi"] for d in docs) == max(values)
    prov = docs[0]["provenance"]
    assert prov["definition"]["name"] == "sqlite-column-stats" and prov["definition"]["version"] == "0.1.0"
    assert prov["image_digest"] == DIGEST and prov["definition"]["builtin"] is False
    html = store.read(f"reports/{job.job_id}/index.html").decode()
    assert "sqlite-column-stats" in html and "Per-shard metrics (rows, mean, lo, hi)" in html


def test_push_rules(sqlite3, azurite, tmp_path, monkeypatch):
    monkeypatch.setenv(names.CONNECTION, azurite.connection_string)
    Storage(azurite.connection_string).ensure()
    good = tmp_path / "good.yaml"
    good.write_text(DEFINITION.replace("0.1.0", "0.2.0"))
    assert _cli("payload", "push", str(good)).exit_code == 0
    again = _cli("payload", "push", str(good))
    assert again.exit_code == 0 and "already registered" in again.output
    csv = tmp_path / "t.csv"
    csv.write_text("time,temp\n0,1.5\n1,2.5\n2,5.0\n")
    ran = _cli("payload", "run", "sqlite-column-stats@0.2.0", "--input", str(csv), "--param", "column=temp")
    doc = json.loads(ran.output)
    assert ran.exit_code == 0 and doc["metrics"] == {"rows": 3, "mean": 3.0, "lo": 1.5, "hi": 5.0}, ran.output
    changed = tmp_path / "changed.yaml"
    changed.write_text(DEFINITION.replace("0.1.0", "0.2.0").replace("a test lab", "another lab"))
    refused = _cli("payload", "push", str(changed))
    assert refused.exit_code == 2 and "a version never changes" in refused.output
    shadow = tmp_path / "shadow.yaml"
    shadow.write_text(DEFINITION.replace("sqlite-column-stats", "gromacs-md"))
    assert "is a built-in payload" in _cli("payload", "push", str(shadow)).output
    bad = tmp_path / "bad.yaml"
    bad.write_text(DEFINITION.replace(f"labcr.azurecr.io/tools/sqlite3@{DIGEST}", "docker.io/keinos/sqlite3:3.40")
                   .replace("command: [sqlite3,", "prepare: [\"sqlite3 -version\"]\ncommand: [sqlite3,"))
    out = _cli("payload", "validate", str(bad))
    assert out.exit_code == 2
    for code in ("image-not-digest", "registry-not-allowed", "command-not-argv"):
        assert f"[{code}]" in out.output, out.output


def test_demo_names_a_missing_tool(monkeypatch):
    from upwell.local.demo import missing_tool

    samples = Path(__file__).resolve().parents[2] / "samples"
    monkeypatch.setenv("PATH", "/nonexistent")
    assert missing_tool(samples / "gromacs-water") == "gmx"
    assert missing_tool(samples / "heat-sweep") is None


WC = """
schema: 1
name: fasta-count
version: 1.0.0
owner: a test lab
image: labcr.azurecr.io/tools/coreutils@sha256:<DIGEST>
input: {required: true, path: input/reads.fa}
command: [grep, -c, "^>", "{input}"]
outputs:
  metrics_regex: {records: '^(\\d+)$'}
""".replace("<DIGEST>", "c0" * 32)


def test_whole_files_reach_the_tool_unchanged(azurite, tmp_path, monkeypatch):
    """A data manifest with shard: {whole_files: true}: each file is one shard, byte for byte (not CSV rows)."""
    from upwell.ingest.ingestor import Ingestor
    from upwell.messages import decode
    from upwell.payloads.registry import Registry
    from upwell.settings import Settings
    from workers.launch import run_payload

    monkeypatch.setenv(names.CONNECTION, azurite.connection_string)
    store = Storage(azurite.connection_string)
    store.ensure()
    store.queue(names.work_queue("cpu")).clear_messages()
    definition = tmp_path / "fasta-count.yaml"
    definition.write_text(WC)
    assert _cli("payload", "push", str(definition)).exit_code == 0
    files = {"a.fa": ">r1\nACGT\n>r2\nGG\n", "b.fa": ">only\nTTTT\nTT\n"}
    for name, text in files.items():
        store.blob(names.INCOMING, f"byo/fasta/data/{name}").upload_blob(text.encode(), overwrite=True)
    manifest = b"payload: fasta-count\ndata: [data/a.fa, data/b.fa]\nshard: {whole_files: true}\n"
    store.blob(names.INCOMING, "byo/fasta/job.yaml").upload_blob(manifest, overwrite=True)
    outcome = Ingestor(store, Settings()).ingest("byo/fasta/job.yaml")
    assert outcome.status == "accepted" and outcome.shards == 2, outcome.message
    items = [decode(m.content) for m in store.queue(names.work_queue("cpu")).receive_messages(max_messages=2)]
    counts = {}
    for item in sorted(items, key=lambda i: i.shard_id):
        assert item.input_blob.endswith(".fa") and item.payload_sha256.startswith("sha256:")
        local = tmp_path / item.shard_id / "in.fa"
        local.parent.mkdir()
        local.write_bytes(store.read(item.input_blob))
        counts[item.shard_id] = run_payload(item, tmp_path / item.shard_id / "work", input_path=local,
                                            definitions=Registry(store)).metrics["records"]
    assert [store.read(i.input_blob).decode() for i in sorted(items, key=lambda i: i.shard_id)] == list(files.values())
    assert counts == {"s00000": 2, "s00001": 1}


def test_no_payloads_container_means_built_ins_only(azurite, tmp_path, monkeypatch):
    """A storage account without the payloads container (an older deployment): ingest still resolves the
    built-ins, an unknown name is refused by name, and a push says what is missing."""
    from upwell.errors import InputRejected
    from upwell.payloads.registry import Registry

    store = Storage(azurite.connection_string)
    store.ensure()
    store.blobs.delete_container(names.PAYLOADS)
    try:
        registry = Registry(store)
        assert "gromacs-md" in registry.names() and registry.resolve("gromacs-md").builtin
        with pytest.raises(InputRejected) as exc:
            registry.resolve("fasta-count")
        assert exc.value.field == "payload"
        with pytest.raises(InputRejected) as exc:
            registry.push(DEFINITION.replace("0.1.0", "9.0.0").encode(), "x.yaml")
        assert "container does not exist" in exc.value.message
    finally:
        import time

        for _ in range(60):  # a container being deleted cannot be re-created for a moment
            store.ensure()
            if store.container(names.PAYLOADS).exists():
                break
            time.sleep(0.5)
        assert store.container(names.PAYLOADS).exists()


def test_payload_list_without_storage_lists_built_ins_and_says_registered_unread(monkeypatch):
    """With no emulator listening, `payload list` still lists the built-ins at once, names what it could
    not read on stderr, and exits 1; it does not retry a refused connection for a minute."""
    from upwell.local.azurite import connection_string, free_ports

    monkeypatch.setenv(names.CONNECTION, connection_string(*free_ports(3)))
    started = time.monotonic()
    listed = CliRunner().invoke(app, ["payload", "list"])
    assert time.monotonic() - started < 15
    assert listed.exit_code == 1
    assert [line.split()[0] for line in listed.stdout.splitlines()] == sorted(builtins())
    assert "registered definitions not read: no stack running: Azurite (blob storage) does not answer on " \
           "127.0.0.1:" in listed.stderr and "`upwell up`" in listed.stderr, listed.stderr
