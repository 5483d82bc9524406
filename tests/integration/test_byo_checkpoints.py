"""The checkpoint trap and the newest-checkpoint rule, with the real agent on Azurite (issue 25 items 3, 7).

A registered definition whose tool (a small Python script) writes its own log into ``{ckpt}``, beside the
declared checkpoint ``state.chk``, and exits 75 on its first attempt: one job where it leaves only the log,
one where it leaves a truncated checkpoint. Both finish on their second attempt (no poisoned shard): the log
never counts as a checkpoint, and the truncated one falls back to a fresh start that the result names.
Then the upload rule: the stored checkpoint is the newest one only, an unchanged file is never sent again."""

from __future__ import annotations

import json
import os
import time

import pytest
import yaml

from tests.pipeline_helpers import ingest_manifest
from upwell import logs, names
from upwell.ledger import Ledger
from upwell.messages import WorkItem
from upwell.payloads.registry import Registry
from upwell.settings import Settings
from upwell.storage import Storage
from workers.agent import Agent, AgentConfig
from workers.staging import Staging

TOOL = r"""
import pathlib, sys
pathlib.Path("ckpt").mkdir(exist_ok=True)
pathlib.Path("ckpt/tool.log").write_text("the tool's own log, not a checkpoint\n")
state = pathlib.Path("ckpt/state.chk")
if "--resume" in sys.argv:
    text = state.read_text()
    if not text.endswith("END\n"):
        sys.exit("cannot read ckpt/state.chk: truncated")
    print("resumed from", text.split()[0])
if sys.argv[2] == "1" and sys.argv[1] == "truncated":
    state.write_text("41 half-wri")
if sys.argv[2] == "1":
    sys.exit(75)
print("done")
"""
DEFINITION = {
    "schema": 1, "name": "ckpt-trap", "version": "1.0.0", "owner": "a test lab",
    "image": "labcr.azurecr.io/tools/trap@sha256:" + "7a" * 32,
    "files": {"trap.py": TOOL.replace("{", "{{").replace("}", "}}")},
    "params": {"mode": {"type": "enum", "choices": ["log", "truncated"], "default": "log"}},
    "command": ["{python}", "trap.py", "{mode}", "{attempt}"],
    "checkpoint": {"files": ["ckpt/state.chk"], "resume": ["--resume"]},
    "outputs": {"metrics_regex": {"done": r"^(done)$"}},
}


@pytest.fixture(scope="module")
def store(azurite) -> Storage:
    store = Storage(azurite.connection_string)
    store.ensure()
    return store


def test_a_log_beside_the_checkpoint_and_a_truncated_checkpoint_both_finish(store, tmp_path):
    store.queue(names.work_queue("cpu")).clear_messages()
    Registry(store, Settings().registry_allowlist).push(yaml.safe_dump(DEFINITION).encode(), "ckpt-trap.yaml")
    jobs = {mode: ingest_manifest(store, f"trap/{mode}/job.yaml", f"payload: ckpt-trap\ngrid: {{mode: [{mode}]}}\n")
            for mode in ("log", "truncated")}
    config = AgentConfig(pool="cpu", node_id=f"node-{time.monotonic_ns()}", scratch=str(tmp_path / "scratch"),
                         state_file=str(tmp_path / "agent.json"), poll_s=0.1, retry_backoff_s=0, max_items=4,
                         idle_exit_s=30)
    assert Agent(store, config, Settings()).run() == 0  # two jobs, two attempts each: a preemption, then the end
    ledger = Ledger(store)
    docs = {mode: json.loads(store.read(f"{names.RESULTS}/{job}/s00000.json")) for mode, job in jobs.items()}
    for mode, doc in docs.items():
        shard = ledger.shard(jobs[mode], "s00000")
        assert doc["status"] == "succeeded" and doc["metrics"] == {"done": "done"}, (mode, doc["error"])
        assert (shard.preemptions, shard.failures) == (1, 0), mode
        assert doc["timings"]["resumed_from"] is None and doc["timings"]["attempt"] == 2
    assert docs["log"]["timings"]["fresh_start"] == ""  # the log alone was no checkpoint: nothing to resume
    assert "could not resume from its checkpoint (exit 1)" in docs["truncated"]["timings"]["fresh_start"]
    truncated_log = store.read(f"{names.RESULTS}/{jobs['truncated']}/s00000/payload.log").decode()
    assert "cannot read ckpt/state.chk: truncated" in truncated_log
    for mode, job in jobs.items():  # the tool's log was never uploaded as a checkpoint
        stored = sorted(b.name.rsplit("/", 1)[1] for b in store.list(names.CHECKPOINTS, f"{job}/s00000/"))
        assert stored == ([] if mode == "log" else ["state.chk"]), (mode, stored)


class Counting(Storage):
    """Storage that counts checkpoint uploads and deletes."""

    def __init__(self, connection: str) -> None:
        super().__init__(connection)
        self.uploads: list[str] = []
        self.deletes: list[str] = []

    def write(self, path, data, **kw):
        if path.startswith(f"{names.CHECKPOINTS}/"):
            self.uploads.append(path.rsplit("/", 1)[1])
        return super().write(path, data, **kw)

    def delete(self, path, **kw):
        self.deletes.append(path.rsplit("/", 1)[1])
        return super().delete(path, **kw)


def test_only_the_newest_checkpoint_is_stored_and_an_unchanged_file_is_not_sent_again(azurite, tmp_path):
    store = Counting(azurite.connection_string)
    staging = Staging(store, str(tmp_path / "scratch"), log=logs.get("upwell.test"))
    job = f"ckpt-newest-{os.getpid()}-{time.monotonic_ns()}"
    item = WorkItem(job_id=job, shard_id="s00000", payload="x", pool="cpu",
                    checkpoint_prefix=f"{names.CHECKPOINTS}/{job}/s00000/")
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "run.log").write_text("kept beside it")
    for step in (100, 200, 300):  # what the runner keeps at each preemption: the newest restart file and the log
        for old in kept.glob("restart.*"):
            old.unlink()
        (kept / f"restart.{step}").write_bytes(b"x" * step)
        assert staging.checkpoint_out(item, kept) == 2
    stored = sorted(b.name.rsplit("/", 1)[1] for b in store.list(names.CHECKPOINTS, f"{job}/s00000/"))
    assert stored == ["restart.300", "run.log"]
    assert store.uploads == ["restart.100", "run.log", "restart.200", "restart.300"]  # run.log once: unchanged
    assert store.deletes == ["restart.100", "restart.200"]
    assert staging.checkpoint_out(item, tmp_path / "empty") == 0  # an attempt that left nothing keeps the stored
    assert len(list(store.list(names.CHECKPOINTS, f"{job}/s00000/"))) == 2
