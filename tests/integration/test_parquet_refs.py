"""Parquet drops as row-group references (issue 24 item 2), on real Azurite: ingest reads only the footer and
makes each shard a set of row groups of the upload at the ETag it read, writing nothing under shards/; the
agent reads only those row groups and stages the CSV file ingest used to copy, byte for byte; an original
overwritten or deleted before the shard runs fails it with ShardSourceChanged, and the payload never runs; a
schema that does not match the rule is rejected naming the column."""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from upwell import logs, names
from upwell.ingest.ingestor import Ingestor
from upwell.ingest.submit import push_rules
from upwell.ledger import Ledger
from upwell.messages import decode
from upwell.settings import Settings
from upwell.shardref import ShardRef
from upwell.storage import Storage
from workers.staging import Staging

RULE = """name: pq-refs
match: "pq-refs/*.parquet"
format: parquet
columns: {time: float, level: float, count: int}
shard: {rows: 5000}
payload: channel-stats
pool: cpu
"""
ROWS, GROUP = 20_000, 2_000  # ten row groups; shards of two (4,000 rows: a third would pass 5,000)


def _parquet(table: pa.Table, group: int) -> bytes:
    out = io.BytesIO()
    pq.write_table(table, out, row_group_size=group)
    return out.getvalue()


def _drop(rows: int = ROWS, seed: int = 0, text: bool = True) -> pa.Table:
    """Random numbers (so the file does not compress to nothing), missing levels, and text that CSV quotes."""
    rng = np.random.default_rng(seed)
    level = pa.array(rng.normal(size=rows), mask=rng.random(rows) < 0.05)
    cols = {"time": np.arange(rows) * 0.5, "level": level, "count": rng.integers(0, 1 << 40, rows)}
    if text:
        cols["site"] = [f'st, "{i % 97}"' for i in range(rows)]
    return pa.table(cols)


def _old_copies(data: bytes, rows_per_shard: int) -> list[bytes]:
    """What ingest's ``shard_parquet`` wrote under shards/ before references: each batch of ``rows_per_shard``
    rows written by pyarrow's ``write_csv`` (its code as it was)."""
    out = []
    for batch in pq.ParquetFile(io.BytesIO(data)).iter_batches(batch_size=rows_per_shard):
        buf = io.BytesIO()
        pacsv.write_csv(pa.Table.from_batches([batch]), buf)
        out.append(buf.getvalue())
    return out


def _drain(store, pool="cpu"):
    q, msgs = store.queue(names.work_queue(pool)), []
    while batch := list(q.receive_messages(max_messages=32, visibility_timeout=30)):
        msgs.extend(batch)
    return sorted(msgs, key=lambda m: decode(m.content).shard_id)


@pytest.fixture(scope="module")
def stack(azurite, tmp_path_factory):
    """The session Azurite with the rule pushed, and a storage counting the bytes each blob read returned."""
    store = Storage(azurite.connection_string)
    store.ensure()
    rules = tmp_path_factory.mktemp("rules")
    (rules / "pq-refs.yaml").write_text(RULE)
    push_rules(store, [rules])
    return store


def _count_reads(monkeypatch, path: str) -> list:
    """The length each blob read of ``path`` asks for (None: from the offset to the end), through any Storage."""
    read, chunks = [], Storage.chunks

    def counted(self, blob, **kw):
        if blob == path:
            read.append(kw.get("length"))
        return chunks(self, blob, **kw)

    monkeypatch.setattr(Storage, "chunks", counted)
    return read


def _ingest(store: Storage, name: str, data: bytes, monkeypatch=None):
    """Upload incoming/pq-refs/<name> and ingest it; (the outcome, its work items' messages in shard order,
    the lengths ingest read of the upload, with ``monkeypatch``)."""
    store.queue(names.work_queue("cpu")).clear_messages()
    store.blob(names.INCOMING, f"pq-refs/{name}").upload_blob(data, overwrite=True)
    read = _count_reads(monkeypatch, f"{names.INCOMING}/pq-refs/{name}") if monkeypatch is not None else []
    out = Ingestor(store, Settings()).ingest(f"pq-refs/{name}")
    if monkeypatch is not None:
        monkeypatch.undo()
    return out, _drain(store), read


def test_a_parquet_drop_is_row_group_references_staged_as_the_old_copies(stack, tmp_path, monkeypatch):
    data = _parquet(_drop(), GROUP)
    out, msgs, read = _ingest(stack, "drop.parquet", data, monkeypatch)
    assert out.status == "accepted", out.message
    items = [decode(m.content) for m in msgs]
    refs = [ShardRef.from_dict(i.input_range) for i in items]
    etag = stack.properties("incoming/pq-refs/drop.parquet").etag
    assert {i.input_blob for i in items} == {"incoming/pq-refs/drop.parquet"} and {r.etag for r in refs} == {etag}
    assert [r.row_groups for r in refs] == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10)]
    assert [r.rows for r in refs] == [4000] * 5 and {r.length for r in refs} == {len(data)}
    # ingest read the footer only (ranged reads from the end; pyarrow asks for at most 64 KiB of it at first)
    # and wrote no shard blob
    assert read and None not in read and sum(read) <= 64 * 1024 < len(data) // 5, (read, len(data))
    assert not list(stack.list(names.SHARDS, f"{out.job_id}/"))
    written = sum(len(m.content) for m in msgs)  # the work items: what ingest wrote per shard, with its row
    assert written < len(data) // 50, (written, len(data))
    rows = sorted(Ledger(stack).shards(out.job_id), key=lambda r: r.shard_id)
    assert [ShardRef.from_dict(r.input_range) for r in rows] == refs
    staging = Staging(stack, str(tmp_path / "scratch"), logs.get("test"))
    staged = []
    for item in items:
        read = _count_reads(monkeypatch, item.input_blob)
        with staging.workdir(item.shard_id) as root:
            path = staging.stage_in(item, root)
            assert path.name == f"{item.shard_id}.csv"  # the name the copy had under shards/<job>/
            staged.append(path.read_bytes())
        monkeypatch.undo()
        # the footer (64 KiB) and two row groups of ten (about 95 KB): two ranged reads, well under the file
        assert None not in read and sum(read) < len(data) // 2, (read, len(data))
    old = _old_copies(data, 4000)
    assert len(old) == 5 and staged == old  # same header, values, quoting and missing cells, byte for byte


def test_a_shard_whose_parquet_original_changed_fails_with_the_named_error(stack, storage_env, tmp_path):
    """Three shards of one drop: the first runs on its row groups (the control); the original is then
    overwritten with a file of the same layout, and the second fails; then deleted, and the third fails.
    Neither failed shard starts its payload."""
    from workers.agent import Agent, AgentConfig

    data = _parquet(_drop(12_000, seed=1, text=False), 4000)
    out, msgs, _ = _ingest(stack, "run.parquet", data)
    assert out.status == "accepted" and len(msgs) == 3, out.message
    agent = Agent(stack, AgentConfig(pool="cpu", node_id="n-pq-refs", idle_exit_s=0.5, poll_s=0.1,
                                     scratch=str(tmp_path)))
    assert agent.handle(msgs[0]) == "succeeded"
    doc = json.loads(stack.read(f"results/{out.job_id}/s00000.json"))
    assert doc["metrics"]["rows"] == 4000, doc["metrics"]
    blob = stack.blob(names.INCOMING, "pq-refs/run.parquet")
    blob.upload_blob(_parquet(_drop(12_000, seed=2, text=False), 4000), overwrite=True)
    for msg, how in ((msgs[1], "was overwritten"), (msgs[2], "is gone")):
        if how == "is gone":
            blob.delete_blob()
        assert agent.handle(msg) == "poisoned"
        sid = decode(msg.content).shard_id
        doc = json.loads(stack.read(f"results/{out.job_id}/{sid}.json"))
        assert doc["status"] == "failed" and doc["poisoned"] and not doc.get("metrics")
        assert doc["error"].startswith("ShardSourceChanged: ") and how in doc["error"] and "row groups" in doc["error"]
        assert not stack.exists(f"results/{out.job_id}/{sid}/payload.log")  # the payload never started


@pytest.mark.parametrize(("table", "field", "says"), [
    (pa.table({"time": [0.0, 1.0], "level": ["1.5", "2.5"], "count": [1, 2]}), "level", "of type string, not float"),
    (pa.table({"time": [0.0, 1.0], "level": [1.5, 2.5], "count": [1.5, 2.0]}), "count", "of type double, not int"),
    (pa.table({"time": [0.0, 1.0], "count": [1, 2]}), "level", "lacks required columns ['level']"),
])
def test_a_parquet_schema_that_does_not_match_the_rule_is_rejected_naming_the_column(stack, table, field, says):
    out, msgs, _ = _ingest(stack, f"bad-{field}.parquet", _parquet(table, 1))
    assert out.status == "rejected" and says in out.message and not msgs, out.message
    error = json.loads(stack.read(f"quarantine/pq-refs/bad-{field}.parquet.error.json"))
    assert error["error"] == "InputRejected" and error["field"] == field


def test_a_file_that_is_not_parquet_is_rejected(stack):
    out, msgs, _ = _ingest(stack, "notes.parquet", b"time,level\n0,1\n" * 100)
    assert out.status == "rejected" and "not a readable Parquet file" in out.message and not msgs


def test_a_manifests_parquet_data_is_row_group_references(stack):
    """A manifest's Parquet data blob is cut the same way: row groups of it at its ETag, nothing copied."""
    data = _parquet(_drop(900, seed=3), 300)
    stack.blob(names.INCOMING, "pq-refs-m/data/d.parquet").upload_blob(data, overwrite=True)
    stack.blob(names.INCOMING, "pq-refs-m/job.yaml").upload_blob(
        b"payload: channel-stats\ndata: [data/d.parquet]\nshard: {rows: 600}\n", overwrite=True)
    stack.queue(names.work_queue("cpu")).clear_messages()
    out = Ingestor(stack, Settings()).ingest("pq-refs-m/job.yaml")
    assert out.status == "accepted", out.message
    refs = [ShardRef.from_dict(decode(m.content).input_range) for m in _drain(stack)]
    assert [(r.row_groups, r.rows) for r in refs] == [((0, 2), 600), ((2, 3), 300)]
    assert {r.etag for r in refs} == {stack.properties("incoming/pq-refs-m/data/d.parquet").etag}
    assert not list(stack.list(names.SHARDS, f"{out.job_id}/"))


def test_a_byte_limit_cuts_the_row_groups_by_their_stored_size(stack, tmp_path):
    """``shard: {bytes: N}`` on a Parquet rule groups row groups by stored size, as ``upwell submit`` counts
    them: two of the ten row groups (each about 48 KB stored) fit in 100 KB, and a third would not."""
    from upwell.ingest.parquetshards import _footer, cuts, local_shards

    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "pq-bytes.yaml").write_text(RULE.replace("pq-refs", "pq-bytes").replace("{rows: 5000}",
                                                                                      "{bytes: 100000}"))
    push_rules(stack, [rules])
    data = _parquet(_drop(), GROUP)
    (tmp_path / "d.parquet").write_bytes(data)
    expect = cuts(_footer(tmp_path / "d.parquet", "d"), None, 100_000, source="d", max_shards=100)
    assert [(a, b) for a, b, _ in expect] == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10)], expect
    stack.queue(names.work_queue("cpu")).clear_messages()
    stack.blob(names.INCOMING, "pq-bytes/drop.parquet").upload_blob(data, overwrite=True)
    out = Ingestor(stack, Settings()).ingest("pq-bytes/drop.parquet")
    refs = [ShardRef.from_dict(decode(m.content).input_range) for m in _drain(stack)]
    assert out.shards == len(expect) == local_shards(tmp_path / "d.parquet", source="d", rows_per_shard=None,
                                                     bytes_per_shard=100_000)
    assert [(r.row_groups[0], r.row_groups[1], r.rows) for r in refs] == expect
