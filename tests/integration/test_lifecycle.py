"""A job's life after ingest, on Azurite, through the real CLI commands: cancel, rerun, delete, prune, logs.

The agent runs in this process (a thread) on the local Azurite; results are collected by calling the
collect function the blob trigger calls. Jobs are named by id, by name and by upload path."""

from __future__ import annotations

import json
import re
import threading
import time
from datetime import UTC, datetime, timedelta

from typer.testing import CliRunner

from tests.pipeline_helpers import ingest_manifest, wait_for
from upwell import logs, names
from upwell.access.principal import Caller
from upwell.cli import app
from upwell.ingest.ingestor import Ingestor
from upwell.ledger import Ledger
from upwell.ops.jobapi import JobAPI
from upwell.results.collect import collect
from upwell.settings import Settings
from upwell.storage import Storage
from workers.agent import Agent, AgentConfig

runner = CliRunner()
# Log to pytest's stderr, not to a CliRunner stream that closes after the first command.
logs.configure()


_ingest = ingest_manifest


def _agent(store: Storage, tmp_path, **kw) -> Agent:
    config = AgentConfig(pool="cpu", node_id=f"node-{time.monotonic_ns()}", scratch=str(tmp_path / "scratch"),
                         poll_s=0.2, retry_backoff_s=0, **kw)
    return Agent(store, config, Settings())


def _run_all(store: Storage, tmp_path, job_id: str, n: int, **kw) -> None:
    """Run n items through an agent, then collect every result, as the collect trigger would."""
    agent = _agent(store, tmp_path, max_items=n, idle_exit_s=5, **kw)
    agent.run()
    for blob in store.list(names.RESULTS, f"{job_id}/"):
        if blob.name.count("/") == 1:
            collect(store, blob.name)


def _cli(*args: str):
    result = runner.invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        return result.exit_code, f"{result.output}{type(result.exception).__name__}: {result.exception}"
    return result.exit_code, result.output


def _wait(predicate, timeout: float, what: str, on_timeout=lambda: ""):
    return wait_for(predicate, timeout, what, on_timeout, poll_s=0.1)


class FakeClock:
    """A clock whose sleep only moves it on: a loop's polls are counted, never timed."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_cancel_stops_the_running_shard_and_drains_only_its_own_messages(store, tmp_path, monkeypatch):
    ledger = Ledger(store)
    victim = _ingest(store, "life/cancel/job.yaml",
                     "name: cancel-me\npayload: logistic\nparams: {sleep_s: 60}\ngrid: {r: [3.1, 3.2, 3.3, 3.4]}\n")
    other = _ingest(store, "life/other/job.yaml", "payload: logistic\ngrid: {r: [3.5]}\n")
    agent = _agent(store, tmp_path, max_items=1)
    outcome: list[str] = []
    orig = agent.handle
    thread = threading.Thread(target=lambda: outcome.append(orig(agent.queue.receive_message(
        visibility_timeout=60))), daemon=True)
    thread.start()
    # Ingest sends a job's messages in parallel, so whichever of its shards is first in the queue runs.
    first = _wait(lambda: next((s.shard_id for s in ledger.shards(victim) if s.status == "running"), None), 30,
                  "a shard of the job to run")

    # The shard sleeps 60 s: "1 of 1 ... stopped" within the command's own 20 s wait is a real stop.
    code, out = _cli("cancel", "cancel-me", "--wait", "20")  # by name
    assert code == 0, out
    assert victim in out and "3 queued message(s) drained" in out, out
    # Per state, each shard once (issue 25 item 11): a shard that finished on its own is never "cancelled".
    assert re.search(r"^\s+3 queued\s+-> cancelled \(never started\)$", out, flags=re.M), out
    assert re.search(r"^\s+1 running\s+-> checkpointed and stopped \(cancelled\)$", out, flags=re.M), out
    thread.join(30)
    assert outcome == ["cancelled"]
    assert ledger.job(victim).status == "cancelled"
    assert {s.shard_id: s.status for s in ledger.shards(victim)} == {
        "s00000": "cancelled", "s00001": "cancelled", "s00002": "cancelled", "s00003": "cancelled"}
    # The other job's message went back, counted as a deferral, not a failure.
    left = store.queue(names.work_queue("cpu")).peek_messages(max_messages=32)
    assert [json.loads(m.content)["job_id"] for m in left] == [other]
    row = ledger.shard(other, "s00000")
    assert row.deferrals == 1 and not row.failures
    # The stopped attempt printed nothing, so it kept no log (a stale one would be deleted), and logs says so.
    assert not store.exists(f"{names.RESULTS}/{victim}/{first}/payload.log")
    code, out = _cli("logs", victim, first)
    assert code == 0 and out == "(no output)\n", out
    code, out = _cli("logs", victim)  # the job's listing shows it too; the three that never started are not there
    assert code == 0 and out == f"== {first} ==\n(no output)\n", out
    # watch ends at once on a cancelled job (it will never be reported), exit 1: after its first poll, not
    # at its timeout (on a clock that only its own sleeps move).
    import upwell.cli.pipeline

    clock = FakeClock()
    with monkeypatch.context() as patched:
        patched.setattr(upwell.cli.pipeline, "time", clock)
        code, out = _cli("watch", victim, "--timeout", "60")
    assert code == 1 and clock.now <= 0.5, (clock.now, out)
    # Cancelling again is harmless; a leftover delivery of a cancelled job is dropped without running.
    code, out = _cli("cancel", victim)
    assert code == 0 and re.search(r"^\s+4 cancelled\s+unchanged", out, flags=re.M), out
    store.queue(names.work_queue("cpu")).clear_messages()
    from upwell.lifecycle.rerun import _item
    from upwell.messages import encode

    queued = next(s.shard_id for s in ledger.shards(victim) if s.shard_id != first)  # never started
    store.queue(names.work_queue("cpu")).send_message(encode(_item(ledger.job(victim), ledger.shard(victim, queued))))
    agent = _agent(store, tmp_path)
    assert agent.handle(agent.queue.receive_message()) == "cancelled"
    assert not store.queue(names.work_queue("cpu")).peek_messages(max_messages=32)
    assert not store.exists(f"{names.RESULTS}/{victim}/{queued}.json")


def test_rerun_failed_only_then_one_shard_and_logs(store, tmp_path):
    ledger = Ledger(store)
    path = "life/rerun/job.yaml"
    job = _ingest(store, path, "payload: logistic\ngrid: {fail_first_attempts: [0, 9, 0]}\n")
    _run_all(store, tmp_path, job, 3, max_dequeue_count=1)
    row = ledger.job(job)
    assert row.status == "partially_failed" and row.shards_failed == 1 and row.shards_done == 2
    code, out = _cli("logs", "incoming/" + path, "s00001")  # by upload path
    assert code == 0 and "injected failure: attempt 1" in out, out

    code, out = _cli("rerun", "life/rerun", "--failed")  # by folder
    assert code == 0 and "re-running 1 shard(s)" in out and "s00001" in out, out
    row = ledger.job(job)
    assert row.status == "accepted" and row.shards_failed == 0 and row.shards_done == 2
    assert not row.reported
    assert ledger.shard(job, "s00001").status == "queued"
    assert not store.exists(f"{names.RESULTS}/{job}/s00001.json")
    msgs = store.queue(names.work_queue("cpu")).peek_messages(max_messages=32)
    assert [(json.loads(m.content)["shard_id"]) for m in msgs] == ["s00001"]
    _run_all(store, tmp_path, job, 1, max_dequeue_count=1)
    assert ledger.job(job).status == "partially_failed"
    assert ledger.shard(job, "s00001").attempts == 1  # counters restarted

    code, out = _cli("rerun", job, "--shard", "s00002")
    assert code == 0 and "s00002" in out and "s00001" not in out.split("shard(s) of")[1], out
    assert ledger.job(job).shards_done == 1
    _run_all(store, tmp_path, job, 1)
    assert ledger.job(job).shards_done == 2 and ledger.job(job).status == "partially_failed"
    code, out = _cli("rerun", job, "--shard", "s00042")
    assert code == 1 and "no shard s00042" in out


def test_a_silent_retry_leaves_no_earlier_attempts_log_behind(store, tmp_path):
    """Attempt 1 fails and prints, so its log is kept; attempt 2 succeeds and prints nothing: the shard's log
    is not attempt 1's any more (deleted, as the row showed an earlier attempt), and its result says 0 bytes."""
    job = _ingest(store, "life/retry/job.yaml", "payload: logistic\ngrid: {fail_first_attempts: [1]}\n")
    log = f"{names.RESULTS}/{job}/s00000/payload.log"
    agent = _agent(store, tmp_path, max_items=1)
    api = JobAPI(store, Settings(), Caller(kind="function_key", name="", projects=None))
    assert api.shard_log(job, "s00000") is None  # no attempt has ended yet: 404, not an empty log
    assert agent.handle(agent.queue.receive_message()) != "succeeded"
    assert b"injected failure: attempt 1" in store.read(log) and b"injected failure" in api.shard_log(job, "s00000")
    _run_all(store, tmp_path, job, 1)
    assert Ledger(store).job(job).status == "succeeded"
    doc = json.loads(store.read(f"{names.RESULTS}/{job}/s00000.json"))
    assert (doc["timings"]["attempt"], doc["log_bytes"], doc["artifacts"]) == (2, 0, {})
    assert not store.exists(log)
    code, out = _cli("logs", job)
    assert code == 0 and out == "== s00000 ==\n(no output)\n", out
    assert api.shard_log(job, "s00000") == b"" and api.shard_log(job, "s00009") is None  # empty; no such shard


def test_delete_removes_blobs_and_rows_and_prune_takes_only_old_jobs(store, tmp_path):
    ledger = Ledger(store)
    old = _ingest(store, "life/old/job.yaml", "payload: logistic\ngrid: {r: [3.3]}\n")
    _run_all(store, tmp_path, old, 1)
    fresh = _ingest(store, "life/fresh/job.yaml", "payload: logistic\ngrid: {r: [3.4]}\n")
    _run_all(store, tmp_path, fresh, 1)
    assert ledger.job(old).status == ledger.job(fresh).status == "succeeded"
    assert list(store.list(names.RESULTS, f"{old}/"))
    # a silent succeeded point keeps no payload.log (its result says it printed 0 bytes); logs says so plainly,
    # on stderr: what stdout holds is the (empty) log, and a job-wide listing shows it under its header
    doc = json.loads(store.read(f"{names.RESULTS}/{old}/s00000.json"))
    assert "payload.log" not in doc["artifacts"] and doc["log_bytes"] == 0
    assert not store.exists(f"{names.RESULTS}/{old}/s00000/payload.log")
    one = runner.invoke(app, ["logs", old, "s00000"])
    assert (one.exit_code, one.stdout, one.stderr) == (0, "", "(no output)\n"), one.output
    code, out = _cli("logs", old)
    assert code == 0 and out == "== s00000 ==\n(no output)\n", out
    ledger.update_job(old, finished_at=(datetime.now(UTC) - timedelta(days=40)).isoformat())

    code, out = _cli("prune", "--older-than", "30d", "--dry-run")
    assert code == 0 and f"would delete {old}" in out and fresh not in out, out
    assert ledger.job(old) is not None
    code, out = _cli("prune", "--older-than", "30d")
    assert code == 0 and f"deleted {old}" in out, out
    assert ledger.job(old) is None and ledger.shards(old) == []
    for container in (names.SHARDS, names.CHECKPOINTS, names.RESULTS, names.REPORTS):
        assert not list(store.list(container, f"{old}/")), container
    assert not store.exists(f"{names.INCOMING}/life/old/job.yaml")
    assert ledger.job(fresh) is not None

    running = _ingest(store, "life/busy/job.yaml", "payload: logistic\ngrid: {r: [3.6]}\n")
    code, out = _cli("delete", running)
    assert code == 1 and "cancel" in out, out
    code, out = _cli("delete", running, "--force", "--yes")
    assert code == 0 and "deleted" in out and ledger.job(running) is None, out
    assert not store.queue(names.work_queue("cpu")).peek_messages(max_messages=32) or all(
        json.loads(m.content)["job_id"] != running for m in store.queue(names.work_queue("cpu")).peek_messages(32))
    # It says what it will remove and asks (issue 25 item 10): no is nothing deleted, yes deletes.
    said = runner.invoke(app, ["delete", fresh], input="n\n")
    assert said.exit_code == 1 and "nothing deleted" in said.output and ledger.job(fresh) is not None, said.output
    assert f"delete {fresh} (succeeded): " in said.output and f"results/{fresh}/  (" in said.output, said.output
    said = runner.invoke(app, ["delete", fresh], input="y\n")
    assert said.exit_code == 0 and ledger.job(fresh) is None, said.output
    code, out = _cli("delete", fresh)
    assert code == 1 and "no such job" in out, out
    code, out = _cli("prune", "--older-than", "soon")
    assert code == 1 and "30d" in out, out


def test_cancel_keeps_the_checkpoint_and_rerun_resumes_from_it(store, tmp_path):
    """heat-mpi under real mpiexec: cancelled mid-run it writes its checkpoint, which the agent keeps; a re-run
    of the cancelled shard resumes from it and finishes the job."""
    ledger = Ledger(store)
    store.queue(names.work_queue("mpi")).clear_messages()
    path = "life/heat/job.yaml"
    store.blob(names.INCOMING, path).upload_blob(
        b"payload: heat-mpi\npool: mpi\nresources: {ranks: 2}\n"
        b"params: {nx: 256, t_end: 0.2, checkpoint_every: 50}\ngrid: {alpha: [1.0]}\n", overwrite=True)
    job = Ingestor(store, Settings()).ingest(path).job_id
    config = AgentConfig(pool="mpi", node_id="node-heat", scratch=str(tmp_path / "scratch"), poll_s=0.2,
                         max_items=1, lease_s=30)
    agent = Agent(store, config, Settings())
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    _wait(lambda: list((tmp_path / "scratch").glob("upwell-*/work/ckpt/progress.json")), 180, "a first checkpoint")
    code, out = _cli("cancel", path, "--wait", "60")
    assert code == 0 and re.search(r"^\s+1 running\s+-> checkpointed and stopped", out, flags=re.M), out
    thread.join(60)
    shard = ledger.shard(job, "s00000")
    assert shard.status == "cancelled" and shard.checkpoints >= 1, shard
    kept = [b.name for b in store.list(names.CHECKPOINTS, f"{job}/s00000/")]
    assert kept, "the cancelled shard's checkpoint was not kept"

    code, out = _cli("rerun", job)
    assert code == 0 and "re-running 1 shard(s)" in out, out
    assert [b.name for b in store.list(names.CHECKPOINTS, f"{job}/s00000/")] == kept
    agent = Agent(store, AgentConfig(pool="mpi", node_id="node-heat-2", scratch=str(tmp_path / "s2"), poll_s=0.2,
                                     max_items=1, idle_exit_s=5, lease_s=30), Settings())
    agent.run()
    for blob in store.list(names.RESULTS, f"{job}/"):
        if blob.name.count("/") == 1:
            collect(store, blob.name)
    doc = json.loads(store.read(f"{names.RESULTS}/{job}/s00000.json"))
    assert doc["status"] == "succeeded" and doc["timings"]["resumed_from"] not in (None, 0), doc["timings"]
    assert ledger.job(job).status == "succeeded"
