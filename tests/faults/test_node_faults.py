"""Dead agents and drain before scale-in (issue 23, acceptance c and d), with real agents on Azurite.

The agents are the local pool's processes (``upwell.pools.process.LocalPool``), each beating into the nodes
table (``upwell.nodelog``) every ``BEAT_S``; the scaler is the real Autoscaler (c) or its node step with the
pool's own scale-in after it, as the Autoscaler runs them (d). The shards are tiny logistic maps that take a
few seconds each (``sleep_s``), long enough to be caught running. Nothing may be lost: every shard's result
exists once and it succeeded.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import yaml

from tests.faults import harness
from tests.pipeline_helpers import wait_for
from upwell import names
from upwell.ingest.ingestor import Ingestor
from upwell.ledger import Ledger
from upwell.nodelog import Liveness, NodeLog, NodeState
from upwell.pools.process import LocalPool, node_id
from upwell.results.collect import collect
from upwell.scale import nodes as node_step
from upwell.scale.autoscaler import Autoscaler
from upwell.settings import Settings
from upwell.storage import Storage

pytestmark = [pytest.mark.cloudfaults]

POOL = "cpu"
BEAT_S = "0.5"
DEAD_AFTER_S = "7"  # above a running agent's lease tick (5 s), its only beat while a payload runs


@pytest.fixture
def beats(stack, monkeypatch) -> Liveness:
    """Agents (spawned with this environment) and the scaler share the beat settings."""
    monkeypatch.setenv("UPWELL_BEAT_S", BEAT_S)
    monkeypatch.setenv("UPWELL_DEAD_AFTER_S", DEAD_AFTER_S)
    return Liveness.from_env(os.environ)


def submit(store: Storage, name: str, shards: int, sleep_s: float) -> tuple[str, list[str]]:
    doc = {"name": f"nodes: {name}", "payload": "logistic", "pool": POOL,
           "params": {"steps": 10, "burn_in": 0, "sleep_s": sleep_s},
           "grid": {"r": harness.r_values(shards)}, "estimate": {"node_seconds_per_shard": sleep_s}}
    blob = f"nodefaults/{name}/job.yaml"
    store.blob(names.INCOMING, blob).upload_blob(yaml.safe_dump(doc).encode(), overwrite=True)
    job_id = Ingestor(store, Settings()).ingest(blob).job_id
    return job_id, [f"s{i:05d}" for i in range(shards)]


def results(store: Storage, job_id: str, shards: list[str]) -> dict[str, dict]:
    out = {}
    for shard in shards:
        try:
            out[shard] = json.loads(store.read(f"{names.RESULTS}/{job_id}/{shard}.json"))
        except Exception:  # noqa: BLE001 - not written yet
            continue
    return out


def lost(store: Storage, job_id: str, shards: list[str]) -> int:
    """Shards without a succeeded result, or whose row says failed or cancelled."""
    ledger, done = Ledger(store), results(store, job_id, shards)
    return sum(1 for s in shards if done.get(s, {}).get("status") != "succeeded"
               or ledger.shard(job_id, s).status.value in ("failed", "cancelled"))


def pid_of(pool: LocalPool, node: str) -> int:
    return int((pool.dir / f"{node.removeprefix('local-')}.pid").read_text())


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def test_c_a_hung_agent_is_found_dead_removed_by_id_and_its_shard_finishes_elsewhere(stack, beats):
    store, ledger, nodelog = stack.storage, Ledger(stack.storage), NodeLog(stack.storage)
    settings, started = Settings(), time.monotonic()
    pool = LocalPool(settings.pools[POOL], stack.state_dir, idle_exit_s=30)
    scaler = Autoscaler(store, settings, pools={POOL: pool}, liveness=beats, state_dir=stack.state_dir)
    job_id, shards = submit(store, "hung", shards=2, sleep_s=4)
    scaler.adapt()  # the backlog asks for agents
    running = wait_for(lambda: [r for r in ledger.running(POOL) if r.node], 60, "a shard running on an agent")
    hung, shard = running[0].node, running[0].shard_id
    wait_for(lambda: getattr(nodelog.get(POOL, hung), "state", None) is NodeState.RUNNING, 30,
             "the running agent's beat")
    pid = pid_of(pool, hung)
    os.kill(pid, signal.SIGSTOP)  # hung: holds its lease and its node, and beats no more
    try:
        scaler.adapt()
        assert nodelog.get(POOL, hung) is not None and alive(pid), "a node was removed before its beat went stale"
        wait_for(lambda: nodelog.get(POOL, hung).dead(time.time(), beats), 60, "the beat to go stale")
        scaler.adapt()  # the first scale run that sees the stale beat removes the node by id
        assert not alive(pid), "the dead agent's process was not removed"
        assert nodelog.get(POOL, hung) is None, "the dead node's row was kept"
        assert hung not in {node_id(w) for w in pool.status().nodes}

        def finished():
            scaler.adapt()  # replacements come from the scaler, as on Azure
            return len(results(store, job_id, shards)) == len(shards)

        wait_for(finished, 120, "every shard to finish", poll_s=0.5)
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
            os.kill(pid, signal.SIGCONT)
    done = results(store, job_id, shards)
    assert done[shard]["node"]["id"] != hung, "the hung agent's shard did not finish elsewhere"
    assert ledger.shard(job_id, shard).attempts >= 2  # its lease came back through visibility
    missing = lost(store, job_id, shards)
    harness.TABLE.append(vars(harness.Counts(fault="hung agent (SIGSTOP): dead, removed by id", shards=len(shards),
                                             kills=1, retries=1, lost=missing,
                                             seconds=round(time.monotonic() - started, 1))))
    assert missing == 0


def test_d_scale_in_while_nodes_are_busy_removes_only_idle_nodes(stack, beats):
    store, ledger, nodelog = stack.storage, Ledger(stack.storage), NodeLog(stack.storage)
    settings, started = Settings(), time.monotonic()
    pool = LocalPool(settings.pools[POOL], stack.state_dir, idle_exit_s=60)
    removals: list[tuple[list[str], bool, set[str], dict]] = []
    remove = pool.remove

    def recording_remove(ids, *, dead=False):  # what was busy and what each row said at the moment of removal
        rows = {r.node: r for r in nodelog.nodes(POOL)}
        removals.append((sorted(ids), dead, {r.node for r in ledger.running(POOL)}, rows))
        remove(ids, dead=dead)

    pool.remove = recording_remove
    pool.scale_to(3)
    wait_for(lambda: len([r for r in nodelog.nodes(POOL) if r.state is NodeState.IDLE]) == 3, 60,
             "three agents beating idle")
    job_id, shards = submit(store, "busy", shards=2, sleep_s=3)
    busy = wait_for(lambda: (lambda b: b if len(b) == 2 else None)({r.node for r in ledger.running(POOL)}), 60,
                    "both shards running")
    wait_for(lambda: all(getattr(nodelog.get(POOL, n), "state", None) is NodeState.RUNNING for n in busy), 30,
             "the busy agents' beats")
    idle = {r.node for r in nodelog.nodes(POOL)} - busy
    assert len(idle) == 1

    def scale_in():  # the Autoscaler's act with a target of 0: the node step, then the pool's own scale-in
        for shard in results(store, job_id, shards):  # collect's part: a shard done leaves the running set
            collect(store, f"{job_id}/{shard}.json")
        running = {r.node for r in ledger.running(POOL)}
        step = node_step.tend(pool, nodelog, beats, pool.status(busy=running), running, target=0)
        pool.scale_to(0, busy=running | step.protected)
        return step

    first = scale_in()
    assert set(first.marked) == idle, (first, busy)  # only the idle node is chosen, never a busy one
    wait_for(lambda: (scale_in(), not pool.status().alive and not nodelog.nodes(POOL))[1], 90,
             "every agent drained and removed", poll_s=0.3)
    removed = [node for ids, *_ in removals for node in ids]
    assert set(removed) == idle | busy, removals
    for ids, dead, running, rows in removals:
        assert not dead and not set(ids) & running, (ids, running)  # never a node with a shard in hand
        assert all(rows[n].state is NodeState.DRAINED and not rows[n].shards for n in ids), rows
    done = results(store, job_id, shards)
    for shard in shards:  # the busy nodes finished their shards where they started: never interrupted
        assert done[shard]["node"]["id"] in busy and done[shard]["timings"]["preemptions"] == 0
        assert ledger.shard(job_id, shard).attempts == 1
    missing = lost(store, job_id, shards)
    harness.TABLE.append(vars(harness.Counts(fault="scale-in with busy nodes: drain, remove idle by id",
                                             shards=len(shards), lost=missing,
                                             seconds=round(time.monotonic() - started, 1))))
    assert missing == 0
