"""Shards that reference the data (issue 24 item 2), on real Azurite: a row block is a byte range of the upload
at the ETag ingest read, not a copy; the agent reads it with a conditional ranged GET and writes the header
first; an original overwritten or deleted before the shard runs fails the shard with ShardSourceChanged, and
the payload never runs on other bytes."""

from __future__ import annotations

import json

import pytest

from upwell import logs, names
from upwell.ingest.ingestor import Ingestor
from upwell.ingest.submit import push_rules
from upwell.ledger import Ledger
from upwell.messages import decode
from upwell.settings import Settings
from upwell.shardref import ShardRef
from workers.staging import Staging

RULE = """name: refs-it
match: "refs-it/*.csv"
format: csv
delimiter: ";"
missing: ["NA"]
columns: {time: float, level: float}
shard: {rows: 3}
payload: channel-stats
pool: cpu
"""
# CRLF line ends, a blank line, a missing value and a ';' delimiter: the range holds them as uploaded, and the
# agent's file is what ingest's copy held (LF, no blank line, NaN, ',').
DROP = b"time;level;site\r\n0;1.5;a\r\n1;NA;b\r\n\r\n2;2.5;c\r\n3;3.5;d\r\n4;4.5;e\r\n5;5.5;f\r\n6;6.5;g"
SHARDS = [b"time,level,site\n0,1.5,a\n1,NaN,b\n2,2.5,c\n", b"time,level,site\n3,3.5,d\n4,4.5,e\n5,5.5,f\n",
          b"time,level,site\n6,6.5,g\n"]


def _drain(store, pool="cpu"):
    q, msgs = store.queue(names.work_queue(pool)), []
    while batch := list(q.receive_messages(max_messages=32, visibility_timeout=30)):
        msgs.extend(batch)
    return msgs


@pytest.fixture
def dropped(store, tmp_path):
    """The rule pushed and the drop ingested: (the ingest's outcome, its work items' messages in shard order)."""
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "refs-it.yaml").write_text(RULE)
    push_rules(store, [tmp_path / "rules"])
    store.blob(names.INCOMING, "refs-it/drop.csv").upload_blob(DROP, overwrite=True)
    out = Ingestor(store, Settings()).ingest("refs-it/drop.csv")
    assert out.status == "accepted", out.message
    return out, sorted(_drain(store), key=lambda m: decode(m.content).shard_id)


def test_row_blocks_are_ranges_of_the_upload_read_with_the_header_first(store, dropped, tmp_path):
    out, msgs = dropped
    items = [decode(m.content) for m in msgs]
    assert len(items) == 3 and {i.input_blob for i in items} == {"incoming/refs-it/drop.csv"}
    etag = store.properties("incoming/refs-it/drop.csv").etag
    refs = [ShardRef.from_dict(i.input_range) for i in items]
    assert {r.etag for r in refs} == {etag}
    assert refs[0].offset == len(b"time;level;site\r\n") and refs[-1].offset + refs[-1].length == len(DROP)
    assert all(a.offset + a.length == b.offset for a, b in zip(refs, refs[1:], strict=False))  # they tile it
    assert not list(store.list(names.SHARDS, f"{out.job_id}/"))  # nothing copied
    rows = Ledger(store).shards(out.job_id)
    assert [ShardRef.from_dict(r.input_range) for r in sorted(rows, key=lambda r: r.shard_id)] == refs
    staging = Staging(store, str(tmp_path / "scratch"), logs.get("test"))
    staged = []
    for item in items:
        with staging.workdir(item.shard_id) as root:
            staged.append(staging.stage_in(item, root).read_bytes())
    assert staged == SHARDS


@pytest.mark.parametrize("change", ["overwritten", "gone"])
def test_a_shard_whose_original_changed_fails_with_the_named_error_and_never_runs(store, dropped, tmp_path,
                                                                                     change):
    from upwell.results.collect import collect
    from workers.agent import Agent, AgentConfig

    out, msgs = dropped
    blob = store.blob(names.INCOMING, "refs-it/drop.csv")
    if change == "overwritten":  # the same length and layout: only the pinned ETag tells the versions apart
        blob.upload_blob(DROP.replace(b"1.5", b"9.5"), overwrite=True)
    else:
        blob.delete_blob()
    agent = Agent(store, AgentConfig(pool="cpu", node_id=f"n-refs-{change}", idle_exit_s=0.5, poll_s=0.1,
                                     scratch=str(tmp_path)))
    assert agent.handle(msgs[0]) == "poisoned"
    sid = decode(msgs[0].content).shard_id
    doc = json.loads(store.read(f"results/{out.job_id}/{sid}.json"))
    assert doc["status"] == "failed" and doc["poisoned"]
    assert doc["error"].startswith("ShardSourceChanged: ") and ("was overwritten" if change == "overwritten"
                                                                 else "is gone") in doc["error"]
    collect(store, f"{out.job_id}/{sid}.json")
    shard = Ledger(store).shard(out.job_id, sid)
    assert shard.status == "failed" and shard.poisoned and shard.error.startswith("ShardSourceChanged")
    # the payload never started: an attempt that ran keeps its payload.log, and no metrics were recorded
    assert not store.exists(f"results/{out.job_id}/{sid}/payload.log") and not doc.get("metrics")
    if change == "overwritten":  # a re-run sends the same range, pinned to the same version, from the shard row
        from upwell.lifecycle.rerun import rerun_job

        assert rerun_job(store, out.job_id, shard_ids=[sid]) == [sid]
        again = [decode(m.content) for m in _drain(store)]
        assert [i.input_range for i in again] == [decode(msgs[0].content).input_range]


def test_whole_files_are_references_staged_byte_for_byte(store, tmp_path):
    """``shard: {whole_files: true}``: each data blob is referenced whole at its ETag, never copied; the agent's
    file is the blob byte for byte."""
    files = {"a.bin": b"\x00\x01binary\r\n\r\n", "b.txt": b"line\r\nno end"}
    for name, data in files.items():
        store.blob(names.INCOMING, f"refs-whole/data/{name}").upload_blob(data, overwrite=True)
    store.blob(names.INCOMING, "refs-whole/job.yaml").upload_blob(
        b"payload: channel-stats\ndata: [data/a.bin, data/b.txt]\nshard: {whole_files: true}\n", overwrite=True)
    out = Ingestor(store, Settings()).ingest("refs-whole/job.yaml")
    assert out.status == "accepted", out.message
    items = sorted((decode(m.content) for m in _drain(store)), key=lambda i: i.shard_id)
    assert [i.input_blob for i in items] == [f"incoming/refs-whole/data/{n}" for n in files]
    assert [ShardRef.from_dict(i.input_range).whole for i in items] == [True, True]
    assert not list(store.list(names.SHARDS, f"{out.job_id}/"))
    staging = Staging(store, str(tmp_path / "scratch"), logs.get("test"))
    for item, data in zip(items, files.values(), strict=True):
        with staging.workdir(item.shard_id) as root:
            assert staging.stage_in(item, root).read_bytes() == data


def test_an_unchanged_original_runs_its_range(store, dropped, tmp_path):
    """The control for the changed-original test: the same agent, an upload left alone, runs a shard on its
    range (channel-stats reads every column but time as a number: this drop has no text column)."""
    from workers.agent import Agent, AgentConfig

    store.blob(names.INCOMING, "refs-it/ok.csv").upload_blob(b"time;level\r\n0;1\r\n1;NA\r\n2;3\r\n3;4\r\n",
                                                              overwrite=True)
    out = Ingestor(store, Settings()).ingest("refs-it/ok.csv")
    msgs = sorted(_drain(store), key=lambda m: decode(m.content).shard_id)
    assert out.status == "accepted" and len(msgs) == 2
    agent = Agent(store, AgentConfig(pool="cpu", node_id="n-refs-ok", idle_exit_s=0.5, poll_s=0.1,
                                     scratch=str(tmp_path)))
    assert agent.handle(msgs[0]) == "succeeded"
    doc = json.loads(store.read(f"results/{out.job_id}/s00000.json"))
    assert doc["status"] == "succeeded" and doc["metrics"]["rows"] == 3, doc["metrics"]
