"""The Autoscaler's orchestration on real Azurite against the real local pool (agent processes on this
machine): what it observes from the ledger and the queue, what it asks the pool for, and that it lets go.

``tests.stub_pool.StubPool`` stands in only where a test needs what the local pool cannot do: fail on
demand, report a quota, or show the busy set it was handed; each such test says so.
"""

from __future__ import annotations

import time
import uuid

import pytest

from tests.pipeline_helpers import wait_for
from tests.stub_pool import StubPool
from upwell import names
from upwell.ingest.ingestor import Ingestor
from upwell.ledger import JobRow, JobState, Ledger, ShardRow, ShardState
from upwell.pools.base import NodeState, PoolSpec, WorkerPool
from upwell.pools.process import LocalPool
from upwell.scale.autoscaler import Autoscaler
from upwell.settings import Settings
from upwell.storage import Storage


@pytest.fixture()
def store(azurite) -> Storage:
    s = Storage(azurite.connection_string)
    s.ensure()
    return s


def _states(pool: LocalPool) -> list[NodeState]:
    return sorted(pool.status().nodes.values())


def _pool_name() -> str:
    return f"t{uuid.uuid4().hex[:10]}"  # a queue and a scaling partition of its own


def _job(ledger: Ledger, pool: str, shard_states: list[ShardState], *, node: str = "") -> str:
    job_id = f"job-{uuid.uuid4().hex[:8]}"
    ledger.create_job(JobRow(job_id=job_id, status=JobState.RUNNING, pool=pool, shards_total=len(shard_states)))
    ledger.add_shards(job_id, [ShardRow(job_id=job_id, shard_id=f"s{i:05d}", status=state, pool=pool,
                                        node=node if state == ShardState.RUNNING else "")
                               for i, state in enumerate(shard_states)])
    return job_id


def _scaler(store: Storage, spec: PoolSpec, pool: WorkerPool) -> Autoscaler:
    return Autoscaler(store, Settings(pools={spec.name: spec}), pools={spec.name: pool})


def test_running_job_row_is_not_a_running_shard(store, local):
    """A running job row also says status=running and names its pool; only shard rows are in flight."""
    ledger, name = Ledger(store), _pool_name()
    job_id = _job(ledger, name, [ShardState.RUNNING] * 3, node="n1")
    running = ledger.running(name)
    assert sorted(r.shard_id for r in running) == ["s00000", "s00001", "s00002"]
    assert all(r.job_id == job_id for r in running)

    spec = PoolSpec(name, backend="local", max_nodes=4)
    scaler = _scaler(store, spec, local(spec))
    jobs = [j for j in ledger.jobs(JobState.RUNNING) if j.pool == name]
    obs = scaler.observe(spec, scaler.pools[name].status(), jobs, scaler.pools[name])
    assert (obs.visible, obs.in_flight, obs.backlog) == (0, 3, 3)


def test_stalled_job_releases_its_node_after_the_cooldown(store, local):
    """A job whose messages are gone (its queue cleared) while its row still says running keeps
    no node: the target falls to 0 after the shrink votes and the cooldown, and the idle agent is
    drained: its process exits."""
    ledger, name = Ledger(store), _pool_name()
    _job(ledger, name, [ShardState.QUEUED] * 3)  # stalled: nothing queued, nothing running
    spec = PoolSpec(name, backend="local", max_nodes=2, scale_down_votes=2, cooldown_s=1.0,
                    options={"boot_s": 0.0})
    pool = local(spec)
    pool.scale_to(1)  # the node the job once had
    wait_for(lambda: _states(pool) == [NodeState.IDLE], 60, "the agent up and idle", lambda: str(_states(pool)))
    scaler = _scaler(store, spec, pool)

    first = scaler.adapt_pool(spec, [])
    assert first.target == 1 and pool.status().alive == 1, first.reason  # one vote to shrink, in the cooldown
    deadline = time.monotonic() + 20
    targets = [first.target]
    while pool.status().nodes and time.monotonic() < deadline:
        time.sleep(0.3)
        targets.append(scaler.adapt_pool(spec, []).target)
    # status() lists every agent whose process is alive, draining or not: none is left
    assert not pool.status().nodes, f"the node was kept: targets {targets}"
    assert targets[-1] == 0
    # ...and it stays released: later runs ask for nothing.
    assert scaler.adapt_pool(spec, []).target == 0 and not pool.status().nodes


def test_scale_in_drains_the_idle_agent_and_never_the_busy_one(store, local):
    """Two agents, one running a real shard: asked for none, the pool drains the idle one (its process
    exits) and leaves the busy one running its shard."""
    name = _pool_name()
    spec = PoolSpec(name, backend="local", max_nodes=2)
    manifest = f"payload: logistic\npool: {name}\nparams: {{sleep_s: 60}}\ngrid: {{r: [3.1]}}\n"
    store.queue(names.work_queue(name)).create_queue()
    store.blob(names.INCOMING, f"{name}/job.yaml").upload_blob(manifest.encode(), overwrite=True)
    accepted = Ingestor(store, Settings(pools={name: spec})).ingest(f"{name}/job.yaml")
    assert accepted.status == "accepted", accepted
    pool = local(spec)
    pool.scale_to(2)
    wait_for(lambda: _states(pool) == [NodeState.IDLE, NodeState.RUNNING], 90, "one agent running the shard",
             lambda: str(_states(pool)))
    nodes = pool.status().nodes
    busy = next(w for w, state in nodes.items() if state is NodeState.RUNNING)
    idle = next(w for w in nodes if w != busy)
    running = Ledger(store).running(name)
    assert [r.node for r in running] == [f"local-{busy}"]  # the ledger names the busy agent too

    pool.scale_to(0, busy={r.node for r in running})
    # status() lists every agent whose process is alive, draining or not
    wait_for(lambda: idle not in pool.status().nodes, 30, "the idle agent to exit", lambda: str(pool.status()))
    assert pool.status().nodes == {busy: NodeState.RUNNING}
    assert [r.shard_id for r in Ledger(store).running(name)] == ["s00000"]  # its shard still running


def test_queue_backlog_counts(store, local):
    """Visible messages are backlog; the in-flight shards come from the ledger, not the queue."""
    ledger, name = Ledger(store), _pool_name()
    _job(ledger, name, [ShardState.RUNNING, ShardState.QUEUED], node="n1")
    queue = store.queue(names.work_queue(name))
    queue.create_queue()
    queue.send_message("{}")
    queue.send_message("{}")
    spec = PoolSpec(name, backend="local", max_nodes=4)
    scaler = _scaler(store, spec, local(spec))
    obs = scaler.observe(spec, scaler.pools[name].status(), [], scaler.pools[name])
    # two messages in the queue: one is the running shard's (leased), one is waiting
    assert (obs.visible, obs.in_flight) == (1, 1)
    queue.delete_queue()


def test_one_ledger_scan_per_pool_and_the_busy_set_reaches_the_pool(store):
    """StubPool: this is about what the autoscaler hands a backend (the busy set) and reads from it (a
    quota), and the local pool has no quota and ignores the busy set (its agents report their own state)."""
    ledger, name = Ledger(store), _pool_name()
    _job(ledger, name, [ShardState.RUNNING, ShardState.RUNNING], node=f"{name}-1")
    spec = PoolSpec(name, backend="stub", max_nodes=1, scale_down_votes=1, cooldown_s=0.0)
    pool = StubPool(spec, quota={"family": "standardDv5Family", "cores": 8, "spot_cores": 0})
    pool.scale_to(1)
    scaler = _scaler(store, spec, pool)
    scans = []
    real = scaler.ledger.running
    scaler.ledger.running = lambda p, *among: scans.append(p) or real(p, *among)
    scaler.adapt()
    assert scans == [name]  # the policy's in-flight count and the backend's busy set: one read
    assert pool.busy == {f"{name}-1"}
    obs = scaler.observe(spec, pool.status(), [], pool)
    assert obs.quota_family == "standardDv5Family" and obs.quota_cores == 8 and obs.boot_s == 0.0
    assert obs.idle == 0  # the busy node is not idle, whatever the backend says


def test_a_failing_pool_does_not_stop_the_others(store, local):
    """The failing pool is a StubPool told to fail (the local pool cannot run out of capacity); the
    other is a real local pool, which still gets its agent."""
    from upwell.errors import PoolError, PoolErrorKind

    failing, working = _pool_name(), _pool_name()
    specs = {failing: PoolSpec(failing, backend="stub", min_nodes=1, max_nodes=2),
             working: PoolSpec(working, backend="local", min_nodes=1, max_nodes=2)}
    pools = {failing: StubPool(specs[failing]), working: local(specs[working])}
    pools[failing].fail_next = PoolError("no capacity", kind=PoolErrorKind.CAPACITY)
    decisions = Autoscaler(store, Settings(pools=specs), pools=pools).adapt()
    assert set(decisions) == {failing, working}
    assert not pools[failing].nodes and len(pools[working].status().nodes) == 1


def test_pool_keywords_are_explicit():
    import inspect

    from upwell.errors import ConfigError
    from upwell.pools import KEYWORDS, POOLS, backend_class, make_pool

    assert set(KEYWORDS) == set(POOLS)
    for backend in POOLS:
        params = inspect.signature(backend_class(backend).__init__).parameters
        declared = {n for n, p in params.items() if n not in ("self", "spec")}
        assert declared == KEYWORDS[backend], backend
        assert not any(p.kind is p.VAR_KEYWORD for p in params.values()), f"{backend} swallows keywords"
    with pytest.raises(ConfigError, match="state_dri"):
        make_pool(PoolSpec("x"), state_dri="/tmp")


def test_unknown_native_state_is_logged_once(monkeypatch, tmp_path):
    import io
    import sys

    from upwell import logs
    from upwell.pools import base

    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    logs.configure(pretty=False)  # binds the renderer to the current stderr
    try:
        monkeypatch.setattr(base, "log", logs.get("upwell.pools"))
        pool = LocalPool(PoolSpec("stubby", backend="local"), tmp_path)
        assert pool.node_state("Idle") is NodeState.IDLE
        assert pool.node_state("Hibernating") is NodeState.UNKNOWN
        assert pool.node_state("hibernating") is NodeState.UNKNOWN
    finally:
        monkeypatch.undo()
        logs.configure(pretty=False)  # back to the real stderr for every later test
    err = out.getvalue()
    assert err.count("pool.unknown_native_state") == 1 and '"native": "Hibernating"' in err


def test_ingesting_jobs_prewarm_the_pool_and_teach_the_arrivals(store, local):
    """A job whose row is written (shard count and estimate known) while its messages are still being sent is
    work already: the pool starts for it; its creation time is the arrival the policy learns, and the learned
    arrivals survive in the persisted state, not in the Autoscaler."""
    from datetime import UTC, datetime, timedelta

    ledger, name = Ledger(store), _pool_name()
    t0 = datetime.now(UTC).replace(microsecond=0)
    iso = lambda t: t.isoformat().replace("+00:00", "Z")  # noqa: E731
    ledger.create_job(JobRow(job_id=f"job-{uuid.uuid4().hex[:8]}", status=JobState.INGESTING, pool=name,
                             shards_total=6, estimate_node_seconds=600.0, created_at=iso(t0)))
    spec = PoolSpec(name, backend="local", max_nodes=8, options={"boot_s": 360.0})
    pool = local(spec)
    scaler = _scaler(store, spec, pool)
    first = scaler.adapt()[name]
    assert first.target == 6 and len(pool.status().nodes) == 6, first.reason  # six agent processes
    assert "6 being ingested" in first.reason
    state = scaler._read_state(name)[0]
    assert state.last_arrival == pytest.approx(t0.timestamp()) and state.gap_s is None

    ledger.create_job(JobRow(job_id=f"job-{uuid.uuid4().hex[:8]}", status=JobState.ACCEPTED, pool=name,
                             shards_total=4, estimate_node_seconds=400.0, created_at=iso(t0 + timedelta(seconds=40))))
    obs = scaler.observe(spec, pool.status(), [j for j in ledger.jobs(JobState.ACCEPTED) if j.pool == name], pool)
    assert obs.task_s == pytest.approx(100.0)  # ingest's estimate over the shard count
    scaler.adapt()
    fresh = _scaler(store, spec, pool)._read_state(name)[0]  # another instance reads what the last run learned
    assert fresh.last_arrival == pytest.approx(t0.timestamp() + 40) and fresh.gap_s == pytest.approx(10.0)


def test_concurrent_runs_on_two_instances_act_once(store, local, tmp_path):
    """The timer on one instance and an ingest nudge on another read the same state; only the run that
    saves first acts on the pool, the other sees the changed ETag and leaves the pool alone."""
    ledger, name = Ledger(store), _pool_name()
    spec = PoolSpec(name, backend="local", max_nodes=8)
    _job(ledger, name, [ShardState.QUEUED] * 3)
    queue = store.queue(names.work_queue(name))
    queue.create_queue()
    for _ in range(3):
        queue.send_message("{}")
    # Each instance's pool keeps its agents in its own folder, so what each one started shows apart.
    first_pool, second_pool = local(spec, tmp_path / "first"), local(spec, tmp_path / "second")
    first, second = _scaler(store, spec, first_pool), _scaler(store, spec, second_pool)

    real_read = second._read_state

    def read_then_lose_the_race(pool: str):
        out = real_read(pool)
        first.adapt()  # the other instance runs between this run's read and its save
        return out

    second._read_state = read_then_lose_the_race
    decision = second.adapt()[name]
    assert len(first_pool.status().nodes) == 3  # the winner scaled for the backlog
    assert decision.target == 3 and second_pool.status().nodes == {}  # the loser decided the same, did not act
    assert _scaler(store, spec, second_pool)._read_state(name)[0] == first._read_state(name)[0]


def test_gang_shards_are_counted_in_nodes_and_asked_for_as_allocations(store):
    """StubPool: this is about the ``gangs`` keyword the autoscaler hands a gang backend (the local pool runs
    one node per shard). A job of 2-node shards (one running, two queued) and an ingesting job of two more:
    the nodes come from the job rows (no read per shard), the backlog counts each shard as 2 nodes, and the
    target's allocations reach scale_to."""
    ledger, name = Ledger(store), _pool_name()
    running_id = f"job-{uuid.uuid4().hex[:8]}"
    ledger.create_job(JobRow(job_id=running_id, status=JobState.RUNNING, pool=name, shards_total=3, nodes=2,
                             estimate_node_seconds=3 * 2 * 60.0))
    ledger.add_shards(running_id, [ShardRow(job_id=running_id, shard_id=f"s{i:05d}", pool=name,
                                            status=ShardState.RUNNING if i == 0 else ShardState.QUEUED,
                                            node=f"{name}-1" if i == 0 else "") for i in range(3)])
    ledger.create_job(JobRow(job_id=f"job-{uuid.uuid4().hex[:8]}", status=JobState.INGESTING, pool=name,
                             shards_total=2, nodes=2))
    queue = store.queue(names.work_queue(name))
    queue.create_queue()
    for _ in range(3):  # the running shard's (leased) and the two waiting
        queue.send_message("{}")
    spec = PoolSpec(name, backend="stub", max_nodes=10, max_step=10)
    pool = StubPool(spec)
    pool.scale_to(2)  # the running gang's allocation
    asked = []
    real = pool.scale_to
    pool.scale_to = lambda n, **kw: asked.append((n, kw.get("gangs"))) or real(n, **kw)
    scaler = _scaler(store, spec, pool)
    obs = scaler.observe(spec, pool.status(), [j for j in ledger.jobs(JobState.RUNNING) if j.pool == name], pool)
    assert (obs.visible, obs.in_flight) == (2, 1)
    assert obs.task_s == pytest.approx(60.0)  # ingest's estimate over the shards and over their 2 nodes
    d = scaler.adapt()[name]
    # 2 waiting (2 more announced, the larger of the two counts) + 1 running, 2 nodes each
    assert d.target == 6 and d.gangs == ((2, 3),), d.reason
    assert asked == [(6, {2: 3})]
    scaler.adapt()  # the pool holds 6 nodes now, but gangs still wait: the allocations are asked for again
    assert asked == [(6, {2: 3})] * 2
    queue.delete_queue()
