"""GPUs shared out among an agent's slots, with the real agent on Azurite (workers.gpus).

A node of two GPUs (``UPWELL_GPUS=0,1``, as ``nvidia-smi`` would list them) runs four shards that ask for one
GPU each, two at a time. A registered definition's tool records the ``CUDA_VISIBLE_DEVICES`` it was started
with: every shard sees exactly one GPU, two shards that ran at the same time never see the same one, and each
result's provenance names the GPU it ran on. A shard that asks for none is started with the environment as the
node has it. And the local pool, whose nodes are agent processes on one machine, gives each node a share of the
machine's GPUs of its own."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml

from tests.pipeline_helpers import ingest_manifest
from upwell import names
from upwell.payloads.registry import Registry
from upwell.pools import process
from upwell.pools.base import PoolSpec
from upwell.pools.process import LocalPool, gpu_share
from upwell.settings import Settings
from workers import gpus
from workers.agent import Agent, AgentConfig

TOOL = r"""
import json, os, pathlib, time
started = time.time()
time.sleep(1.5)
pathlib.Path("out").mkdir(exist_ok=True)
json.dump({"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "t0": started, "t1": time.time()},
          open("out/seen.json", "w"))
"""
DEFINITION = {
    "schema": 1, "name": "gpu-seen", "version": "1.0.0", "owner": "a test lab",
    "image": "labcr.azurecr.io/tools/gpu-seen@sha256:" + "3c" * 32,
    "files": {"seen.py": TOOL.replace("{", "{{").replace("}", "}}")},
    "params": {"i": {"type": "int", "default": 0}},
    "command": ["{python}", "seen.py"],
    "resources": {"gpus": 1},
    "outputs": {"metrics_json": "out/seen.json"},
}


def test_two_slots_on_two_gpus_each_see_one_of_their_own(store, tmp_path, monkeypatch):
    monkeypatch.setenv("UPWELL_GPUS", "0,1")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(gpus, "_NODE", None)  # the agent reads the node's GPUs afresh
    store.queue(names.work_queue("cpu")).clear_messages()
    Registry(store, Settings().registry_allowlist).push(yaml.safe_dump(DEFINITION).encode(), "gpu-seen.yaml")
    one = ingest_manifest(store, "gpus/one/job.yaml", "payload: gpu-seen\ngrid: {i: [1, 2, 3, 4]}\n")
    none = ingest_manifest(store, "gpus/none/job.yaml", "payload: gpu-seen\nresources: {gpus: 0}\n")
    config = AgentConfig(pool="cpu", node_id=f"node-{time.monotonic_ns()}", scratch=str(tmp_path / "scratch"),
                         state_file=str(tmp_path / "agent.json"), poll_s=0.1, retry_backoff_s=0, slots=2,
                         max_items=5, idle_exit_s=20)
    assert Agent(store, config, Settings()).run() == 0

    docs = [json.loads(store.read(f"{names.RESULTS}/{one}/s{i:05d}.json")) for i in range(4)]
    assert all(d["status"] == "succeeded" for d in docs), [d["error"] for d in docs]
    seen = [(d["metrics"]["visible"], d["metrics"]["t0"], d["metrics"]["t1"]) for d in docs]
    assert all(v in ("0", "1") for v, _, _ in seen), seen
    assert [d["provenance"]["gpus"] for d in docs] == [[v] for v, _, _ in seen]
    overlapping = [(a, b) for i, a in enumerate(seen) for b in seen[i + 1:] if a[1] < b[2] and b[1] < a[2]]
    assert overlapping, seen  # the two slots did run shards at the same time
    assert all(a[0] != b[0] for a, b in overlapping), seen
    assert {v for v, _, _ in seen} == {"0", "1"}

    alone = json.loads(store.read(f"{names.RESULTS}/{none}/s00000.json"))
    assert alone["status"] == "succeeded" and alone["metrics"]["visible"] is None, alone
    assert alone["provenance"]["gpus"] == []
    assert gpus.node().held == {"0": 0, "1": 0}  # every lease given back


def _exec_environ(pid: int, timeout: float = 10.0) -> dict[str, str]:
    """The environment ``pid`` was started with, once its exec has finished: Popen returns when the child's
    close-on-exec pipe closes, which the kernel does before the new program's environment is in place, and
    /proc/<pid>/environ reads empty (or the parent's) until then. UPWELL_NODE_ID is in every agent's and
    not in this process's."""
    deadline = time.monotonic() + timeout
    while True:
        raw = Path(f"/proc/{pid}/environ").read_bytes().decode()
        environ = dict(v.split("=", 1) for v in raw.split("\0") if "=" in v)
        if "UPWELL_NODE_ID" in environ or time.monotonic() > deadline:
            return environ
        time.sleep(0.01)


def test_local_nodes_on_one_machine_each_get_their_own_share_of_its_gpus(azurite, tmp_path):
    assert gpu_share(list("0123"), 1, 2) == ["0", "2"] and gpu_share(list("0123"), 2, 2) == ["1", "3"]
    assert gpu_share(list("0123"), 1, 1) == list("0123")  # one node: all of them
    assert [gpu_share(["0", "1"], k, 3) for k in (1, 2, 3)] == [["0"], ["1"], ["0"]]  # fewer GPUs: round robin
    env = {**os.environ, names.CONNECTION: azurite.connection_string, "UPWELL_GPUS": "0,1,2,3"}
    pool = LocalPool(PoolSpec("gpu", backend="local", max_nodes=2), tmp_path, idle_exit_s=30, env=env)
    try:
        pool.scale_to(2)
        given = {}
        for wid, (pid, _) in pool._workers().items():
            environ = _exec_environ(pid)
            if "UPWELL_GPUS" not in environ:  # an empty environ is an agent that has exited (a zombie): say why
                log = pool.log_dir / f"worker-{wid}.log"
                pytest.fail(f"{wid} (pid {pid}, exit {process._CHILDREN[pid].poll()}) has no UPWELL_GPUS; "
                            f"its log ends: {log.read_text()[-2000:] if log.exists() else '(none)'}")
            given[wid] = environ["UPWELL_GPUS"]
        assert given == {"gpu-1": "0,2", "gpu-2": "1,3"}, given
        assert all(process._CHILDREN[pid].poll() is None for pid, _ in pool._workers().values())
    finally:
        pool.close(timeout=15)
