"""Ingest against real Azurite: manifests, instrument drops, duplicates, quarantine."""

import json
from pathlib import Path

import pytest

from upwell import names
from upwell.errors import InputRejected
from upwell.ingest.blobnames import check_name, job_id_for
from upwell.ingest.ingestor import Ingestor
from upwell.ingest.submit import push_rules, submit
from upwell.ledger import Ledger
from upwell.messages import decode
from upwell.settings import Settings
from upwell.storage import Storage

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def store(azurite):
    s = Storage(azurite.connection_string)
    s.ensure()
    for q in names.ALL_QUEUES:
        s.queue(q).clear_messages()
    return s


def _upload(store, name, data: bytes) -> str:
    return store.blob(names.INCOMING, name).upload_blob(data, overwrite=True)["etag"]


def _drain(store, pool):
    msgs = []
    q = store.queue(names.work_queue(pool))
    while batch := list(q.receive_messages(max_messages=32, visibility_timeout=5)):
        for m in batch:
            msgs.append(decode(m.content))
            q.delete_message(m)
    return msgs


def test_manifest_sweep_enqueues_one_item_per_point(store):
    [up] = submit(store, [REPO / "samples" / "sweep"], "it/")
    out = Ingestor(store, Settings()).ingest(up.blob)
    assert out.status == "accepted" and out.shards == 12 and out.job_id == up.job_id
    items = _drain(store, "cpu")
    assert sorted(i.params["r"] for i in items) == sorted([2.8, 3.0, 3.2, 3.4, 3.5, 3.55, 3.6, 3.7, 3.8, 3.83,
                                                          3.9, 4.0])
    assert {i.job_id for i in items} == {up.job_id}
    job = Ledger(store).job(up.job_id)
    assert job.status == "accepted" and job.shards_total == 12 and job.estimate_usd > 0
    assert len(Ledger(store).shards(up.job_id)) == 12


def test_same_upload_delivered_twice_is_one_job(store):
    etag = _upload(store, "dup/job.yaml", b"payload: logistic\ngrid: {r: [3.1, 3.2]}\n")
    ing = Ingestor(store, Settings())
    first, second = ing.ingest("dup/job.yaml"), ing.ingest("dup/job.yaml")
    assert first.job_id == second.job_id == job_id_for("dup/job.yaml", etag)
    assert (first.status, second.status) == ("accepted", "duplicate")
    assert len(_drain(store, "cpu")) == 2


def test_new_upload_of_same_name_is_a_new_job(store):
    _upload(store, "again/job.yaml", b"payload: logistic\ngrid: {r: [3.1]}\n")
    a = Ingestor(store, Settings()).ingest("again/job.yaml")
    _upload(store, "again/job.yaml", b"payload: logistic\ngrid: {r: [3.3]}\n")
    b = Ingestor(store, Settings()).ingest("again/job.yaml")
    assert a.job_id != b.job_id and b.status == "accepted"


def test_instrument_drop_sharded_by_rule(store):
    push_rules(store, [REPO / "samples" / "pipelines"])
    [up] = submit(store, [REPO / "samples" / "instrument" / "buoy-2026-11-30.csv"], "instruments/buoy/")
    out = Ingestor(store, Settings()).ingest(up.blob)
    assert out.status == "accepted" and out.shards == 4
    items = _drain(store, "cpu")
    # each shard is a byte range of the drop itself (upwell.shardref), nothing is copied under shards/
    assert all(i.payload == "welch" and i.input_blob == f"incoming/{up.blob}" and i.input_range for i in items)
    assert not list(store.list(names.SHARDS, f"{out.job_id}/"))
    rows = sum(store.read(i.input_blob)[i.input_range["offset"]:][:i.input_range["length"]].count(b"\n")
               for i in items)
    assert rows == 4000


def test_bad_upload_is_quarantined_with_error_file(store):
    bad = b"payload: logistic\ngrid: {r: [3.1, 7.5]}\n"
    _upload(store, "bad/job.yaml", bad)
    out = Ingestor(store, Settings()).ingest("bad/job.yaml")
    assert out.status == "rejected"
    assert store.read("quarantine/bad/job.yaml") == bad
    err = json.loads(store.read("quarantine/bad/job.yaml.error.json"))
    assert err["field"] == "grid.r" and err["row"] == 1 and "less than or equal to 4" in err["message"]
    assert not store.exists("incoming/bad/job.yaml")
    assert Ledger(store).job(out.job_id).status == "rejected"


def test_unmatched_instrument_file_is_quarantined(store):
    _upload(store, "nowhere/x.csv", b"time,a\n1,2\n")
    out = Ingestor(store, Settings()).ingest("nowhere/x.csv")
    assert out.status == "rejected" and "no pipeline rule matches" in out.message
    assert store.exists("quarantine/nowhere/x.csv.error.json")


def test_budget_below_estimate_rejected(store):
    _upload(store, "cheap/job.yaml", b"payload: logistic\ngrid: {r: [3.1, 3.2]}\nbudget_usd: 0.0000001\n"
                                     b"estimate: {node_seconds_per_shard: 3600}\n")
    out = Ingestor(store, Settings()).ingest("cheap/job.yaml")
    assert out.status == "rejected" and "exceeds the budget" in out.message



def test_a_gang_on_a_vmss_pool_is_quarantined_naming_the_pools_that_can_run_it(store):
    """An upload that skipped `upwell submit` (Storage Explorer): ingest refuses it with the same named error."""
    from upwell.settings import PoolSpec

    pools = {"cpu": PoolSpec("cpu", backend="vmss", max_nodes=8, options={"cores_per_node": 4}),
             "hpc": PoolSpec("hpc", backend="slurm", max_nodes=2, options={"cores_per_node": 4})}
    _upload(store, "gang/job.yaml", b"payload: logistic\npool: cpu\nresources: {nodes: 2}\ngrid: {r: [3.1]}\n")
    out = Ingestor(store, Settings(pools=pools)).ingest("gang/job.yaml")
    assert out.status == "rejected"
    err = json.loads(store.read("quarantine/gang/job.yaml.error.json"))
    assert err["error"] == "GangUnsupported" and err["field"] == "resources.nodes"
    assert "pools that can run it: hpc" in err["message"]
    assert _drain(store, "cpu") == []

@pytest.mark.parametrize("name", ["../etc/passwd", "/abs/job.yaml", "a/../b.csv", "ctl\x07.csv", "x" * 1100])
def test_bad_names_refused(name):
    with pytest.raises(InputRejected) as err:
        check_name(name)
    assert err.value.field == "name"


def test_unusable_input_is_failed_once_not_retried(store, tmp_path):
    """A payload that exits 65 (EX_DATAERR) names the problem; the agent fails the shard at once, poisons the
    message, and collect counts it, with the attempt on the shard row's history."""
    from upwell.results.collect import collect
    from workers.agent import Agent, AgentConfig

    store.blob(names.INCOMING, "perm/data/values.csv").upload_blob(b"time,a\n1,x\n2,y\n", overwrite=True)
    etag = _upload(store, "perm/job.yaml", b"payload: channel-stats\ndata: [data/values.csv]\n")
    out = Ingestor(store, Settings()).ingest("perm/job.yaml")
    assert out.status == "accepted" and out.job_id == job_id_for("perm/job.yaml", etag)
    agent = Agent(store, AgentConfig(pool="cpu", node_id="n-perm", idle_exit_s=0.5, poll_s=0.1, scratch=str(tmp_path)))
    assert agent.handle(store.queue(names.work_queue("cpu")).receive_message(visibility_timeout=30)) == "poisoned"
    doc = json.loads(store.read(f"results/{out.job_id}/s00000.json"))
    assert doc["status"] == "failed" and doc["poisoned"] and "not retried" in doc["error"]
    assert "'x'" in doc["stderr_tail"] or "x" in doc["stderr_tail"]
    done = collect(store, f"{out.job_id}/s00000.json")
    assert done.job_done and done.job_status == "failed"
    shard = Ledger(store).shard(out.job_id, "s00000")
    assert shard.poisoned is True and shard.attempts == 1
    poison = store.queue(names.poison_queue(names.work_queue("cpu"))).receive_messages(max_messages=32)
    assert any(out.job_id in m.content for m in poison)
