"""Slots per node and batched receive, on Azurite: one agent runs several shards at once, each with its
own lease, and each shard still ends exactly once; a preemption with two in flight puts both back.
Also the rows the agent reuses: job rows kept for a bounded time (workers.jobrows), the shard row's ETag
tried first (Ledger.shard_started, Ledger.finish_shard), and a stale row only costing a re-read."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.pipeline_helpers import ingest_manifest, wait_for
from upwell import names
from upwell.ledger import JobRow, Ledger, ShardRow, ShardState
from upwell.results.collect import collect
from upwell.settings import Settings
from upwell.storage import Storage
from workers.agent import Agent, AgentConfig
from workers.jobrows import JobRows

REPO = Path(__file__).resolve().parents[2]


_ingest = ingest_manifest


def _agent(store: Storage, tmp_path: Path, **kw) -> Agent:
    config = AgentConfig(pool="cpu", node_id=f"node-{time.monotonic_ns()}", scratch=str(tmp_path / "scratch"),
                         state_file=str(tmp_path / "agent.json"), poll_s=0.1, retry_backoff_s=0, **kw)
    return Agent(store, config, Settings())


def _collect_all(store: Storage, job_id: str) -> list:
    return [collect(store, b.name) for b in store.list(names.RESULTS, f"{job_id}/") if b.name.count("/") == 1]


def _running(ledger: Ledger, job_id: str) -> list[str]:
    return sorted(s.shard_id for s in ledger.shards(job_id) if s.status == ShardState.RUNNING)


def test_two_slots_run_two_shards_at_once_and_each_ends_once(store, tmp_path):
    ledger = Ledger(store)
    job = _ingest(store, "slots/two/job.yaml", "payload: logistic\nparams: {sleep_s: 3}\ngrid: {r: [3.1, 3.2]}\n")
    agent = _agent(store, tmp_path, slots=2, max_items=2, idle_exit_s=10)
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    wait_for(lambda: _running(ledger, job) == ["s00000", "s00001"], 30, "both shards running at once",
             lambda: str(_running(ledger, job)), poll_s=0.1)
    # the state file is written just after the row is marked (workers.node.holding): wait for it too
    both = [f"{job}/s00000", f"{job}/s00001"]
    wait_for(lambda: sorted(json.loads((tmp_path / "agent.json").read_text()).get("shards", [])) == both, 10,
             "the state file naming both shards", poll_s=0.05)
    state = json.loads((tmp_path / "agent.json").read_text())
    assert state["state"] == "running" and sorted(state["shards"]) == both, state
    thread.join(60)
    assert not thread.is_alive() and agent.processed == 2
    assert json.loads((tmp_path / "agent.json").read_text())["state"] == "stopped"

    docs = {sid: json.loads(store.read(f"{names.RESULTS}/{job}/{sid}.json")) for sid in ("s00000", "s00001")}
    assert all(d["status"] == "succeeded" for d in docs.values()), docs
    a, b = (docs[s]["timings"] for s in ("s00000", "s00001"))
    assert a["started"] < b["finished"] and b["started"] < a["finished"], (a, b)  # they overlapped
    assert all(d["shard_row"]["status"] == "running" and d["shard_row"]["etag"] for d in docs.values())
    done = _collect_all(store, job)
    assert sorted(c.counted for c in done) == [True, True] and sum(c.job_done for c in done) == 1
    assert not any(c.counted for c in _collect_all(store, job))  # a second delivery of each result
    row = ledger.job(job)
    assert row.status == "succeeded" and row.shards_done == 2 and row.shards_failed == 0
    assert all(s.status == "succeeded" and s.attempts == 1 and not s.failures for s in ledger.shards(job))
    assert not store.queue(names.work_queue("cpu")).peek_messages(max_messages=32)



def _count_receives(agent) -> list[int]:
    """How many messages each of the agent's receives returned, in order (a list the agent appends to)."""
    batches: list[int] = []
    receive = agent.storage.receive_many

    def counting(queue, **kw):
        msgs = receive(queue, **kw)
        batches.append(len(msgs))
        return msgs

    agent.storage.receive_many = counting
    return batches

def test_batched_receive_leases_and_renews_each_message(store, tmp_path):
    """One receive takes three messages for three free slots; each lease (8 s) is renewed by its own
    slot while a 12 s payload runs, so none reappears and each shard runs once."""
    ledger = Ledger(store)
    job = _ingest(store, "slots/batch/job.yaml",
                  "payload: logistic\nparams: {sleep_s: 12}\ngrid: {r: [3.1, 3.2, 3.3]}\n")
    agent = _agent(store, tmp_path, slots=3, max_items=3, idle_exit_s=10, lease_s=8)
    batches = _count_receives(agent)
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    wait_for(lambda: len(_running(ledger, job)) == 3, 30, "three shards running", poll_s=0.1)
    visible = []
    while thread.is_alive():  # well past the 8 s lease: the renewals keep every message hidden
        visible += store.queue(names.work_queue("cpu")).peek_messages(max_messages=32)
        thread.join(0.5)
    assert [n for n in batches if n] == [3], batches
    assert not visible, [m.content for m in visible]
    docs = [json.loads(store.read(f"{names.RESULTS}/{job}/s0000{i}.json")) for i in range(3)]
    assert all(d["status"] == "succeeded" and d["timings"]["attempt"] == 1 for d in docs), docs
    assert all(s.attempts == 1 for s in ledger.shards(job))
    assert sum(c.counted for c in _collect_all(store, job)) == 3 and ledger.job(job).status == "succeeded"


def test_a_queue_of_eight_on_four_slots_is_received_in_two_calls(store, tmp_path):
    """Issue 24 item 5: freed slots wait (up to refill_s, a bound that ends when the last busy slot frees) for
    the others, so one Get Messages call fills all four: 8 messages in 2 receives, never more than 4 at once."""
    ledger = Ledger(store)
    grid = ", ".join(f"3.{i}" for i in range(8))
    job = _ingest(store, "slots/refill/job.yaml", f"payload: logistic\ngrid: {{r: [{grid}]}}\n")
    agent = _agent(store, tmp_path, slots=4, max_items=8, idle_exit_s=10, refill_s=60)
    batches = _count_receives(agent)
    assert agent.run() == 0 and agent.processed == 8
    assert batches == [4, 4], batches
    assert all(s.status == "running" and s.attempts == 1 for s in ledger.shards(job))  # each claimed once
    assert len([b for b in store.list(names.RESULTS, f"{job}/") if b.name.count("/") == 1]) == 8


def test_sigterm_with_two_in_flight_preempts_and_releases_both(store, tmp_path):
    ledger = Ledger(store)
    job = _ingest(store, "slots/preempt/job.yaml",
                  "payload: logistic\nparams: {sleep_s: 60}\ngrid: {r: [3.1, 3.2]}\n")
    env = {**os.environ, names.CONNECTION: store.connection_string, "UPWELL_NODE_ID": "node-slots",
           "UPWELL_SLOTS": "2", "UPWELL_LEASE_S": "60", "UPWELL_POLL_S": "0.1", "UPWELL_SCRATCH": str(tmp_path),
           "PYTHONPATH": str(REPO)}
    agent = subprocess.Popen([sys.executable, "-m", "workers.agent", "--pool", "cpu", "--idle-exit", "30"],
                             cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: _running(ledger, job) == ["s00000", "s00001"], 60, "both shards running at once",
                 lambda: str(_running(ledger, job)))
        assert agent.poll() is None
        agent.send_signal(signal.SIGTERM)
        out = agent.communicate(timeout=60)[0].decode()
    finally:
        if agent.poll() is None:
            agent.kill()
    assert agent.returncode == 0, out[-3000:]
    assert out.count("agent.preempted") == 2, out[-3000:]
    for shard in ledger.shards(job):
        assert shard.status == "preempted" and shard.preemptions == 1 and not shard.failures, shard
    # Both visible again at once, not after their 60 s leases.
    peeked = store.queue(names.work_queue("cpu")).peek_messages(max_messages=32)
    assert sorted(json.loads(m.content)["shard_id"] for m in peeked) == ["s00000", "s00001"]
    # Nothing under results/: a preempted attempt writes no result, and these printed nothing, so kept no log.
    assert not list(store.list(names.RESULTS, f"{job}/"))


def test_slots_default_to_one_and_follow_the_environment(monkeypatch):
    assert AgentConfig(pool="cpu").slots == 1
    monkeypatch.setenv("UPWELL_SLOTS", "3")
    assert AgentConfig.from_env("cpu").slots == 3
    from upwell.pools.azure_common import agent_env
    from upwell.pools.base import PoolSpec, agent_slots

    assert agent_slots(PoolSpec("cpu", tasks_per_node=4)) == 4 and agent_env(PoolSpec("cpu", tasks_per_node=4))[
        "UPWELL_SLOTS"] == "4"
    assert agent_slots(PoolSpec("mpi", tasks_per_node=4)) == 1 and "UPWELL_SLOTS" not in agent_env(PoolSpec("cpu"))


# -- the rows the agent reuses ---------------------------------------------------------------------


def test_job_rows_are_reused_for_their_ttl_and_read_again_after_a_rerun():
    now = [0.0]
    reads: list[str] = []
    rows = {"j": JobRow(job_id="j", status="running")}

    def read(job_id):
        reads.append(job_id)
        return rows.get(job_id)

    cache = JobRows(read, ttl_s=5.0, clock=lambda: now[0])
    assert cache.get("j").status == "running" and cache.get("j").status == "running" and reads == ["j"]
    rows["j"] = JobRow(job_id="j", status="cancelled")
    now[0] = 4.9
    assert cache.get("j").status == "running"  # within the bound
    assert cache.get("j", max_age_s=1.0).status == "cancelled"  # a running shard's tick asks for fresher
    rows["j"] = JobRow(job_id="j", status="accepted", reruns=1)
    assert cache.get("j", shard=ShardRow(job_id="j", shard_id="s", reruns=0)).status == "cancelled"
    assert cache.get("j", shard=ShardRow(job_id="j", shard_id="s", reruns=1)).status == "accepted"  # re-run seen
    now[0] = 20.0
    rows.pop("j")
    assert cache.get("j") is None and len(reads) == 4
    no_cache = JobRows(read, ttl_s=0, clock=lambda: now[0])
    no_cache.get("x"), no_cache.get("x")
    assert reads[-2:] == ["x", "x"]  # ttl 0: every delivery reads, as before


def test_slots_that_find_the_job_row_stale_at_once_share_one_read():
    entered, release = threading.Event(), threading.Event()
    reads: list[str] = []

    def read(job_id):
        reads.append(job_id)
        entered.set()
        release.wait(30)
        return JobRow(job_id=job_id, status="cancelled")

    cache = JobRows(read, ttl_s=5.0, clock=lambda: 0.0)
    out: list = []
    lead = threading.Thread(target=lambda: out.append(cache.get("j")))
    lead.start()
    assert entered.wait(30)
    joiner = threading.Thread(target=lambda: out.append(cache.get("j", max_age_s=0)))  # no copy is fresh enough
    joiner.start()
    wait_for(lambda: cache._flights["j"].waiters == 1, 30, "the second slot joining the read in flight", poll_s=0.01)
    release.set()
    lead.join(30), joiner.join(30)
    assert reads == ["j"] and [r.status for r in out] == ["cancelled", "cancelled"]  # one read, both answered


def test_shard_started_on_a_stale_row_reads_again_and_a_terminal_one_is_refused(store):
    ledger = Ledger(store)
    job = _ingest(store, "slots/rows/job.yaml", "payload: logistic\ngrid: {r: [3.1, 3.2]}\n")
    seen = ledger.shard(job, "s00000")
    ledger.shard_deferred(job, "s00000")  # someone else writes: the row in hand is stale now
    etag = ledger.shard_started(job, "s00000", node="n", pool="cpu", attempt=1, row=seen)
    assert etag == "?"  # started after a re-read; the new ETag is not known
    row = ledger.shard(job, "s00000")
    assert row.status == "running" and row.deferrals == 1 and ledger.job(job).status == "running"
    fresh = ledger.shard(job, "s00001")
    etag = ledger.shard_started(job, "s00001", node="n", pool="cpu", attempt=1, row=fresh, job=ledger.job(job))
    assert etag and etag == ledger.shard(job, "s00001").etag  # one conditional write, no read
    ledger.finish_shard(job, "s00001", "succeeded", {})
    assert not ledger.shard_started(job, "s00001", node="n", pool="cpu", attempt=2, row=fresh)


def test_finish_shard_on_held_rows_counts_once_and_survives_stale_ones(store):
    ledger = Ledger(store)
    job = _ingest(store, "slots/finish/job.yaml", "payload: logistic\ngrid: {r: [3.1, 3.2, 3.3]}\n")
    etags = {s: ledger.shard_started(job, s, node="n", pool="cpu", attempt=1, row=ledger.shard(job, s))
             for s in ("s00000", "s00001", "s00002")}
    held = {s: ShardRow(job_id=job, shard_id=s, status=ShardState.RUNNING, etag=e) for s, e in etags.items()}
    stale_job = ledger.job(job)
    first = ledger.finish_shard(job, "s00000", "succeeded", {}, shard=held["s00000"], job=stale_job)
    assert first.counted and not first.job_done
    # The job row moved on (the first finish): the held copy fails its ETag and both rows are read again.
    second = ledger.finish_shard(job, "s00001", "failed", {}, shard=held["s00001"], job=stale_job)
    assert second.counted
    # A held shard row that is out of date (it has ended since) cannot count it twice.
    again = ledger.finish_shard(job, "s00001", "succeeded", {}, shard=held["s00001"], job=ledger.job(job))
    assert not again.counted
    ledger.shard_deferred(job, "s00002")  # the agent's ETag is stale now
    last = ledger.finish_shard(job, "s00002", "succeeded", {}, shard=held["s00002"], job=ledger.job(job))
    assert last.counted and last.job_done and last.job_status == "partially_failed"
    row = ledger.job(job)
    assert (row.shards_done, row.shards_failed) == (2, 1)


def test_a_first_delivery_skips_the_checkpoint_listing_and_a_shard_with_one_kept_resumes(store, tmp_path,
                                                                                          monkeypatch):
    ledger = Ledger(store)
    job = _ingest(store, "slots/ckpt/job.yaml", "payload: logistic\ngrid: {r: [3.1, 3.2]}\n")
    # s00001 was cancelled with a checkpoint kept (the row counts it): its next attempt must look for it.
    store.write(f"{names.CHECKPOINTS}/{job}/s00001/progress.json", b'{"count": 1, "marker": "kept"}')
    ledger.shard_started(job, "s00001", node="n0", pool="cpu", attempt=1)
    ledger.shard_cancelled(job, "s00001", checkpoints=1)
    ledger.reopen_shard(job, "s00001")  # upwell rerun: attempts back to 0, the kept checkpoint counted still
    listed: list[str] = []
    real_list = Storage.list

    def spy(self, container, prefix="", *args, **kw):
        if container == names.CHECKPOINTS:
            listed.append(prefix)
        return real_list(self, container, prefix, *args, **kw)

    monkeypatch.setattr(Storage, "list", spy)
    agent = _agent(store, tmp_path, max_items=2, idle_exit_s=5)
    assert agent.run() == 0
    assert listed == [f"{job}/s00001/"], listed  # s00000 never ran before: no listing
    docs = {sid: json.loads(store.read(f"{names.RESULTS}/{job}/{sid}.json")) for sid in ("s00000", "s00001")}
    assert {d["status"] for d in docs.values()} == {"succeeded"}
    assert docs["s00001"]["timings"]["resumed_from"] == "kept" and docs["s00000"]["timings"]["resumed_from"] is None
