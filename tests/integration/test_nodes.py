"""The nodes table on real Azurite: an agent's heartbeat (its rate, its drain mark), the scaler's node step
(dead and drained nodes removed by id, idle ones marked draining, busy ones never), and the dashboard's
nodes view. Acceptance c and d, with real agents end to end, are in tests/faults/test_node_faults.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.pipeline_helpers import wait_for
from upwell import names
from upwell.errors import PoolError
from upwell.nodelog import Liveness, NodeLog, NodeRow, NodeState
from upwell.ops import dashboard
from upwell.pools.base import NodeState as PoolNodeState
from upwell.pools.base import PoolSpec, PoolStatus, WorkerPool
from upwell.scale import nodes as node_step
from upwell.settings import Settings
from workers.node import Heartbeat

REPO = Path(__file__).resolve().parents[2]
LIVE = Liveness(beat_s=1.0, dead_after_s=10.0)
NOW = 1_000_000.0


class RecordingPool(WorkerPool):
    """Removes and drains by id, recording each call; ``fail`` makes remove raise PoolError."""

    removes_by_id = True

    def __init__(self, spec: PoolSpec, *, fail: bool = False) -> None:
        super().__init__(spec)
        self.removed: list[tuple[list[str], bool]] = []
        self.drained: list[list[str]] = []
        self.fail = fail

    def remove(self, node_ids, *, dead: bool = False) -> None:
        if self.fail:
            raise PoolError("remove refused")
        self.removed.append((sorted(node_ids), dead))

    def drain(self, node_ids) -> None:
        self.drained.append(sorted(node_ids))

    def scale_to(self, n, *, spot=None, busy=None, gangs=None) -> None:
        raise AssertionError("the node step never scales")

    def status(self, *, busy=None) -> PoolStatus:
        raise AssertionError("the node step is handed the status")


class CountingLog(NodeLog):
    """The real table, counting the agent's writes and reads."""

    def __init__(self, storage) -> None:
        super().__init__(storage)
        self.writes: list[NodeRow] = []
        self.reads = 0

    def beat(self, row, *, first=False):
        self.writes.append(row)
        super().beat(row, first=first)

    def get(self, pool, node):
        self.reads += 1
        return super().get(pool, node)


def _pool() -> str:
    return f"n{uuid.uuid4().hex[:10]}"  # a partition of its own


def _row(pool: str, node: str, state: NodeState, age: float, **kw) -> NodeRow:
    return NodeRow(pool=pool, node=node, state=state, beat=NOW - age, **kw)


def _seed(log: NodeLog, *rows: NodeRow) -> None:
    for row in rows:
        log.beat(row, first=True)
        if row.draining:
            log.mark(row.pool, [row.node])


def test_heartbeat_writes_on_a_change_of_state_and_at_most_once_per_interval(store):
    log, pool, clock = CountingLog(store), _pool(), [0.0]
    beat = Heartbeat(log, pool, "vm-1", beat_s=30.0, vm_size="Standard_D4s_v5", clock=lambda: clock[0])
    beat.beat(NodeState.IDLE, [])
    for t in (1.0, 5.0, 29.0):  # the loop ticks every poll: no write within the interval
        clock[0] = t
        beat.beat(NodeState.IDLE, [])
    assert [w.state for w in log.writes] == [NodeState.IDLE] and log.reads == 0
    beat.beat(NodeState.RUNNING, ["job/s00001"])  # a change of state is written at once, without a read
    assert [w.state for w in log.writes] == [NodeState.IDLE, NodeState.RUNNING] and log.reads == 0
    clock[0] = 31.0
    beat.beat(NodeState.RUNNING, ["job/s00001"])  # 31 s since the last read: the mark is read; no write due
    assert log.reads == 1 and len(log.writes) == 2
    clock[0] = 59.5
    beat.beat(NodeState.RUNNING, ["job/s00001"])  # 30.5 s since the last write: written again
    assert [w.state for w in log.writes] == [NodeState.IDLE, NodeState.RUNNING, NodeState.RUNNING]
    assert log.reads == 1
    row = log.get(pool, "vm-1")
    assert row.state is NodeState.RUNNING and row.shards == ("job/s00001",) and row.vm_size == "Standard_D4s_v5"


def test_heartbeat_reads_the_drain_mark_and_a_first_beat_clears_an_old_one(store):
    log, pool, clock = NodeLog(store), _pool(), [0.0]
    log.mark(pool, ["vm-1"])  # left by the scaler for an earlier agent of this id
    beat = Heartbeat(log, pool, "vm-1", beat_s=1.0, clock=lambda: clock[0])
    assert beat.beat(NodeState.RUNNING, ["j/s1"]) is False and not log.get(pool, "vm-1").draining
    log.mark(pool, ["vm-1"])
    clock[0] = 2.0
    assert beat.beat(NodeState.RUNNING, ["j/s1"]) is True
    assert log.get(pool, "vm-1").state is NodeState.DRAINING  # marked, still holding its shard


def test_an_agent_marked_draining_takes_no_work_says_drained_and_exits(store, storage_env, tmp_path):
    pool, log = _pool(), NodeLog(store)
    env = {**os.environ, "UPWELL_BEAT_S": "0.2", "UPWELL_NODE_ID": "vm-7", "UPWELL_SCRATCH": str(tmp_path),
           "UPWELL_POLL_S": "0.1"}
    store.queue(names.work_queue(pool)).create_queue()
    proc = subprocess.Popen([sys.executable, "-m", "workers.agent", "--pool", pool, "--idle-exit", "120"], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: getattr(log.get(pool, "vm-7"), "state", None) is NodeState.IDLE, 60, "the agent's beat")
        log.mark(pool, ["vm-7"])
        out = proc.communicate(timeout=60)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out[-2000:]
    row = log.get(pool, "vm-7")
    assert row.state is NodeState.DRAINED and row.draining and not row.shards, out[-2000:]


def test_node_step_removes_dead_and_drained_nodes_by_id_and_drains_only_idle_ones(store):
    log, name = NodeLog(store), _pool()
    _seed(log, _row(name, "dead", NodeState.RUNNING, age=11, shards=("j/s1",)),
          _row(name, "drained", NodeState.DRAINED, age=0, draining=True),
          _row(name, "gone", NodeState.STOPPED, age=11),
          _row(name, "busy", NodeState.IDLE, age=0),  # the ledger says it holds a shard
          _row(name, "idle-a", NodeState.IDLE, age=0), _row(name, "idle-b", NodeState.IDLE, age=0),
          _row(name, "working", NodeState.RUNNING, age=0, shards=("j/s2",)))
    pool = RecordingPool(PoolSpec(name, backend="local"))
    status = _status(name, 4, pending=1)  # the backend sees the four live agents and one node booting
    step = node_step.tend(pool, log, LIVE, status, busy={"busy", "working"}, target=2, now=NOW)
    assert pool.removed == [(["dead"], True), (["drained"], False)]
    assert step.dead == ("dead",) and step.drained == ("drained",)
    # four alive, target 2: two drained, chosen among the idle ones the ledger does not show busy
    assert set(step.marked) == {"idle-a", "idle-b"} and pool.drained == [sorted(step.marked)]
    assert step.protected == {"busy", "idle-a", "idle-b", "working"}
    rows = {r.node: r for r in log.nodes(name)}
    assert set(rows) == {"busy", "idle-a", "idle-b", "working"}  # dead, drained and long-gone rows forgotten
    assert rows["idle-a"].draining and not rows["busy"].draining and not rows["working"].draining


def _status(name: str, alive: int, pending: int = 0) -> PoolStatus:
    """What the backend sees: ``alive`` nodes with an agent up, ``pending`` still booting."""
    nodes = {f"n{i}": PoolNodeState.IDLE for i in range(alive)} | {f"p{i}": PoolNodeState.PENDING
                                                                   for i in range(pending)}
    return PoolStatus(name, target=alive + pending, nodes=nodes)


def test_rows_of_agents_gone_without_a_last_beat_do_not_make_a_live_one_surplus(store):
    log, name = NodeLog(store), _pool()
    # three fresh-looking idle rows, but the backend sees one agent: two died without a last beat
    _seed(log, *(_row(name, node, NodeState.IDLE, age=0) for node in ("ghost-1", "ghost-2", "live")))
    pool = RecordingPool(PoolSpec(name, backend="local"))
    step = node_step.tend(pool, log, LIVE, _status(name, 1), busy=(), target=1, now=NOW)
    assert step.marked == () and pool.drained == []
    step = node_step.tend(pool, log, LIVE, _status(name, 1), busy=(), target=0, now=NOW)
    assert len(step.marked) == 1  # a real surplus of one is still drained


def test_node_step_clears_marks_not_acted_on_when_the_target_rises(store):
    log, name = NodeLog(store), _pool()
    _seed(log, _row(name, "a", NodeState.IDLE, age=0, draining=True), _row(name, "b", NodeState.IDLE, age=0),
          _row(name, "c", NodeState.DRAINING, age=0, draining=True, shards=("j/s1",)))
    pool = RecordingPool(PoolSpec(name, backend="local"))
    step = node_step.tend(pool, log, LIVE, PoolStatus(name, target=3), busy={"c"}, target=3, now=NOW)
    assert step.marked == () and not pool.removed
    rows = {r.node: r for r in log.nodes(name)}
    assert not rows["a"].draining and rows["c"].draining  # c already drains with its shard in hand


def test_node_step_keeps_rows_when_the_backend_refuses_and_skips_pools_without_removal(store):
    log, name = NodeLog(store), _pool()
    _seed(log, _row(name, "dead", NodeState.IDLE, age=60))
    failing = RecordingPool(PoolSpec(name, backend="local"), fail=True)
    assert node_step.tend(failing, log, LIVE, PoolStatus(name, target=1), busy=(), target=1, now=NOW).dead == ()
    assert log.get(name, "dead") is not None  # tried again next run

    class NoRemoval(RecordingPool):
        removes_by_id = False

    other = NoRemoval(PoolSpec(name, backend="slurm"))
    assert node_step.tend(other, log, LIVE, PoolStatus(name, target=1), busy=(), target=0, now=NOW) == \
        node_step.NodeStep()
    assert not other.removed and not other.drained


def test_dashboard_lists_nodes_with_their_age_and_calls_a_stale_one_dead(store, monkeypatch):
    monkeypatch.setenv("UPWELL_DEAD_AFTER_S", "60")
    log, name = NodeLog(store), _pool()
    now = datetime.now(UTC)
    _seed(log, NodeRow(name, "fresh", NodeState.RUNNING, shards=("j/s1",), beat=now.timestamp() - 2),
          NodeRow(name, "stale", NodeState.IDLE, beat=now.timestamp() - 600))
    settings = Settings(pools={name: PoolSpec(name, backend="local")})
    rows = {n["node"]: n for n in dashboard.nodes(store, settings, now)}
    assert rows["fresh"]["age_s"] == pytest.approx(2, abs=0.5) and not rows["fresh"]["dead"]
    assert rows["fresh"]["shards"] == ["j/s1"] and rows["fresh"]["state"] == "running"
    assert rows["stale"]["dead"] and rows["stale"]["age_s"] >= 600


def test_node_step_counts_a_gang_agent_as_its_allocations_nodes(store):
    log, name = NodeLog(store), _pool()
    _seed(log, _row(name, "gang", NodeState.IDLE, age=0, nodes=4), _row(name, "one", NodeState.IDLE, age=0))
    pool = RecordingPool(PoolSpec(name, backend="batch"))
    step = node_step.tend(pool, log, LIVE, _status(name, 5), busy=(), target=4, now=NOW)
    assert step.marked == ("one",)  # five nodes for a target of four: the one-node agent goes, not the gang
    step = node_step.tend(pool, log, LIVE, _status(name, 5), busy=(), target=0, now=NOW)
    assert step.marked == ("gang",)
    assert log.get(name, "gang").nodes == 4


def test_a_node_waiting_out_an_event_is_no_capacity_and_its_row_goes_once_its_beats_stop(store):
    """An agent in ``maintenance`` (workers.eviction.watched: a Scheduled Event of its VM is listed, it holds
    nothing and takes nothing) beats, so its row says why it takes no work; the scaler neither counts it toward
    the target nor marks or protects it (it cannot work for minutes, or its VM is going), and never removes it
    as dead: once its beats stop (the VM went), its row is forgotten, as a stopped agent's is."""
    log, name = NodeLog(store), _pool()
    _seed(log, _row(name, "rebooting", NodeState.MAINTENANCE, age=0, event="Reboot"),
          _row(name, "preempted", NodeState.MAINTENANCE, age=11, event="Preempt"),
          _row(name, "idle-a", NodeState.IDLE, age=0))
    pool = RecordingPool(PoolSpec(name, backend="local"))
    step = node_step.tend(pool, log, LIVE, _status(name, 3), busy=(), target=1, now=NOW)
    assert pool.removed == [] and step.dead == () and step.drained == ()
    assert step.marked == () and pool.drained == []  # one idle agent for a target of one: no surplus
    assert step.protected == {"idle-a"}
    rows = {r.node: r for r in log.nodes(name)}
    assert set(rows) == {"rebooting", "idle-a"}  # the VM whose beats stopped is forgotten
    assert rows["rebooting"].state is NodeState.MAINTENANCE and rows["rebooting"].event == "Reboot"


def test_a_heartbeat_names_the_event_a_node_waits_out_and_clears_it_when_work_resumes(store, monkeypatch):
    monkeypatch.setenv("UPWELL_DEAD_AFTER_S", "60")
    log, name = NodeLog(store), _pool()
    beat = Heartbeat(log, name, "vm-1", beat_s=60.0)
    beat.beat(NodeState.MAINTENANCE, [], event="Reboot,Redeploy")
    settings = Settings(pools={name: PoolSpec(name, backend="local")})
    [shown] = dashboard.nodes(store, settings, datetime.now(UTC))
    assert shown["state"] == "maintenance" and shown["event"] == "Reboot,Redeploy" and not shown["dead"]
    beat.beat(NodeState.IDLE, [])  # the event left the document: the loop runs again
    row = log.get(name, "vm-1")
    assert row.state is NodeState.IDLE and row.event == ""


def test_a_new_scheduled_event_is_written_at_once_and_an_unchanged_one_once_per_interval(store):
    """IMDS may list a second event while the node waits out the first (a Freeze, then a Reboot of the same
    VM): the row names both at the next beat, not a whole interval later; the same list is not written again
    within the interval."""
    log, pool, clock = CountingLog(store), _pool(), [0.0]
    beat = Heartbeat(log, pool, "vm-1", beat_s=30.0, clock=lambda: clock[0])
    beat.beat(NodeState.MAINTENANCE, [], event="Freeze")
    clock[0] = 5.0
    beat.beat(NodeState.MAINTENANCE, [], event="Freeze")
    assert [w.event for w in log.writes] == ["Freeze"]
    clock[0] = 6.0
    beat.beat(NodeState.MAINTENANCE, [], event="Freeze,Reboot")
    assert [w.event for w in log.writes] == ["Freeze", "Freeze,Reboot"]
    assert log.get(pool, "vm-1").event == "Freeze,Reboot"
