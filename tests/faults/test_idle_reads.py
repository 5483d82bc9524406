"""Issue 24, item 4: an idle tick reads nothing it read last tick unless it changed, and never misses an event.

One Azurite for the module; the timers are the real ones (``handlers.scale.scale``, the reconciler's pass,
``handlers.janitor.janitor``) called on this thread, every storage request they send counted by
``tests.faults.request_meter``. The idle stack holds finished jobs (a job row, shard rows and an ended
entry in the jobs index each, ended long ago); its pools have no nodes.

- ``test_idle_cost_does_not_grow_with_history``: the requests of one idle tick of each timer, after 10 and
  after 200 finished jobs, are equal and within the bounds below; none of the scale tick's and the janitor's
  requests reads the jobs table, and the reconciler's reads none. The reconciler's pass runs on a clock two
  hours on (the pass an hour after the last job ended: its ended-jobs window then holds nothing, as it does
  on a stack left idle).
- ``test_an_idle_pool_still_sees_every_event_within_one_tick``: with a warm node on one pool and the
  others settled, a message, a job being ingested, its cancel and a node whose beat went stale are each
  seen by the very next tick.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest

import handlers.janitor
import handlers.scale
from tests.faults import harness
from tests.faults.request_meter import RequestMeter
from upwell import jobindex, names
from upwell.ledger import JobRow, JobState, Ledger, ShardRow, ShardState
from upwell.local.stack import DEFAULT_SCHEDULE, RECONCILE_SCHEDULE
from upwell.ncrontab import parse
from upwell.nodelog import NodeLog, NodeRow
from upwell.nodelog import NodeState as BeatState
from upwell.ops.reconcile import Reconciler
from upwell.scalelog import ScalingLog
from upwell.settings import Settings

# Requests per idle tick (what each is: bench/README.md, "Idle ticks"). Before issue 24's item 4 the scale
# tick made 15 (3 queue lengths, the open-jobs index twice, the nodes table and the policy state read and
# written per pool) and the reconciler's pass 9 with two scans of the jobs table.
SCALE_TICK = 5  # each pool's queue length, the open-jobs index, the ended-jobs index's head
RECONCILE_PASS = 6  # its state, dead letters, poison, incoming/, the open index, the ended index (was 7 with a
# query of the jobs table's rows changed since the last pass, before the job catalogue)
JANITOR_RUN = 1  # the open-jobs index (its overdue and budget checks)
JANITOR_SCHEDULE = "0 7 * * * *"  # handlers/janitor.py
IDLE_POOLS = {"backend": "local", "max_nodes": 0, "price_key": "Standard_D2s_v5"}


def pools(warm_cpu: bool = False) -> str:
    import json

    cpu = {**IDLE_POOLS, "min_nodes": 1, "max_nodes": 1} if warm_cpu else IDLE_POOLS
    return json.dumps({"cpu": cpu, "mpi": IDLE_POOLS, "gpu": IDLE_POOLS})


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[harness.Stack]:
    with harness.module_stack(tmp_path_factory.mktemp("idle"), UPWELL_POOLS=pools()) as stack:
        yield stack


def seed_finished(storage, n: int) -> None:
    """Finished jobs ``done-00000`` .. (``n`` of them in all), 3 shard rows each, ended long ago in the index."""
    jobs, index = storage.table(names.JOBS_TABLE), storage.table(names.JOB_INDEX_TABLE)

    def one(i: int) -> None:
        job_id = f"done-{i:05d}"
        job = JobRow(job_id=job_id, status=JobState.SUCCEEDED, pool="cpu", shards_total=3, shards_done=3,
                     created_at="2026-01-01T00:00:00.000Z", finished_at="2026-01-01T00:01:00.000Z", reported=True)
        rows = [ShardRow(job_id=job_id, shard_id=f"s{k:05d}", status=ShardState.SUCCEEDED, pool="cpu")
                for k in range(3)]
        jobs.submit_transaction([("upsert", r.to_entity()) for r in (job, *rows)])
        index.upsert_entity({"PartitionKey": jobindex.PARTITION, "job_id": job_id,
                             "RowKey": f"{jobindex.ENDED}{9 * 10**12 + i:013d}-{job_id}"})

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, range(n)))


def metered(fn) -> RequestMeter:
    meter = RequestMeter()
    with meter:
        fn()
    return meter


def idle_costs(storage) -> dict[str, RequestMeter]:
    """One idle tick of each timer, metered, after the ticks that settle it."""
    reconciler = Reconciler(storage, Settings.from_env(), clock=lambda: time.time() + 7200.0)
    for _ in range(3):
        handlers.scale.scale(None)
    for _ in range(2):
        reconciler.run()
    return {"scale": metered(lambda: handlers.scale.scale(None)), "reconcile": metered(reconciler.run),
            "janitor": metered(lambda: handlers.janitor.janitor(None))}


def per_minute(counts: dict[str, int]) -> float:
    """Requests per idle minute under `upwell up`'s schedules (the scale and reconcile timers as the local
    stack sets them, the janitor hourly)."""
    def runs(schedule: str) -> float:
        a, b = parse(schedule).occurrences(datetime(2026, 1, 1, tzinfo=UTC), 2)
        return 60.0 / (b - a).total_seconds()

    return (counts["scale"] * runs(DEFAULT_SCHEDULE) + counts["reconcile"] * runs(RECONCILE_SCHEDULE)
            + counts["janitor"] * runs(JANITOR_SCHEDULE))


def test_idle_cost_does_not_grow_with_history(world, monkeypatch):
    harness.apply_env(monkeypatch, {**world.env, "UPWELL_POOLS": pools()})
    seen = {}
    for n in (10, 200):
        seed_finished(world.storage, n)
        costs = idle_costs(world.storage)
        seen[n] = {k: m.total for k, m in costs.items()}
        print(n, seen[n], f"{per_minute(seen[n]):.1f} requests per idle minute")
        for name, m in costs.items():
            print(" ", name, dict(m.detail))
        for name in ("scale", "janitor"):  # no read of the jobs table: nothing that grows with history
            assert not [k for k in costs[name].detail if " jobs(" in k or " jobs?" in k], costs[name].detail
        assert not [k for k in costs["scale"].detail if "scaling(" in k or "nodes(" in k], costs["scale"].detail
        assert not [k for k in costs["reconcile"].detail if k.split()[1] != "GET" or " jobs(" in k], \
            costs["reconcile"].detail
    assert seen[10] == seen[200], seen
    assert seen[10] == {"scale": SCALE_TICK, "reconcile": RECONCILE_PASS, "janitor": JANITOR_RUN}, seen
    assert per_minute(seen[10]) <= 20 * SCALE_TICK + RECONCILE_PASS / 5 + 1, seen


def test_an_idle_pool_still_sees_every_event_within_one_tick(world, monkeypatch):
    harness.apply_env(monkeypatch, {**world.env, "UPWELL_POOLS": pools(warm_cpu=True)})
    storage, ledger, nodelog = world.storage, Ledger(world.storage), NodeLog(world.storage)
    scaler = handlers.scale.autoscaler()
    handlers.scale.scale(None)  # the warm node of cpu starts
    harness.wait_until(lambda: [r.state for r in nodelog.nodes("cpu")] == [BeatState.IDLE], 90, "the warm agent")
    for _ in range(3):
        handlers.scale.scale(None)
    tick = metered(lambda: handlers.scale.scale(None))
    # settled: a pool with a node reads its nodes' beats (the one thing that changes), no policy state
    assert tick.total == SCALE_TICK + 1 and tick.detail["MainThread GET nodes()"] == 1, dict(tick.detail)

    queue = storage.queue(names.work_queue("mpi"))
    queue.send_message("{}")  # a message: the next tick sees it and records the backlog
    before = len(ScalingLog(storage).decisions("mpi"))
    handlers.scale.scale(None)
    decisions = ScalingLog(storage).decisions("mpi")
    assert len(decisions) == before + 1 and decisions[-1].visible == 1, decisions
    queue.clear_messages()
    assert "backlog 0" in scaler.adapt()["mpi"].reason

    job = JobRow(job_id="idle-upload", status=JobState.INGESTING, pool="mpi", shards_total=4,
                 created_at=datetime.now(UTC).isoformat())
    ledger.create_job(job)  # an upload: ingest writes the job row (and its index entry) first
    assert "4 being ingested" in scaler.adapt()["mpi"].reason
    ledger.update_job(job.job_id, status=JobState.CANCELLED)  # its cancel: the next tick lets it go
    assert "being ingested" not in scaler.adapt()["mpi"].reason

    node = nodelog.nodes("cpu")[0].node
    pid = next(pid for wid, (pid, _) in scaler.pools["cpu"]._workers().items() if node.endswith(wid))
    os.kill(pid, signal.SIGSTOP)  # the agent hangs: its beat goes stale while its process stays
    nodelog.beat(NodeRow(pool="cpu", node=node, beat=1.0, beat_at="1970-01-01T00:00:01Z"))
    handlers.scale.scale(None)
    assert nodelog.get("cpu", node) is None, "the dead node was not removed by the next tick"
    assert not any(pid == p for p, _ in scaler.pools["cpu"]._workers().values())
    handlers.scale.scale(None)  # and its replacement is asked for at once (min_nodes 1)
    assert scaler.pools["cpu"].status().alive == 1
