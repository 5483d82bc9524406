"""The janitor's view of a pool's activity (``upwell.ops.janitor.pool_activity``, read from the scaler's
decisions in Table scaling) against a real local pool: agents as processes, a real shard running, and the
real Autoscaler recording what it saw. A pool that runs work reads as active; one that never had work, and
so never had a node, reads as idle."""

from __future__ import annotations

import uuid

from tests.pipeline_helpers import wait_for
from upwell import names
from upwell.ingest.ingestor import Ingestor
from upwell.ledger import Ledger
from upwell.ops.janitor import pool_activity
from upwell.pools.base import NodeState, PoolSpec
from upwell.scale.autoscaler import Autoscaler
from upwell.settings import Settings
from upwell.storage import Storage


def _pool_name() -> str:
    return f"j{uuid.uuid4().hex[:10]}"  # a queue and a scaling partition of its own


def _ingest_long_shard(store: Storage, spec: PoolSpec) -> str:
    """One job of one shard that runs for a minute (unless stopped), on ``spec``'s pool."""
    store.queue(names.work_queue(spec.name)).create_queue()
    path = f"{spec.name}/job.yaml"
    manifest = f"payload: logistic\npool: {spec.name}\nparams: {{sleep_s: 60}}\ngrid: {{r: [3.1]}}\n"
    store.blob(names.INCOMING, path).upload_blob(manifest.encode(), overwrite=True)
    accepted = Ingestor(store, Settings(pools={spec.name: spec})).ingest(path)
    assert accepted.status == "accepted", accepted
    return accepted.job_id


def test_a_pool_running_a_shard_is_active_and_one_without_work_is_idle(azurite, local):
    store = Storage(azurite.connection_string)
    store.ensure()
    busy, quiet = _pool_name(), _pool_name()
    specs = {n: PoolSpec(n, backend="local", max_nodes=1, options={"boot_s": 0.0}) for n in (busy, quiet)}
    pools = {n: local(spec) for n, spec in specs.items()}
    store.queue(names.work_queue(quiet)).create_queue()
    job_id = _ingest_long_shard(store, specs[busy])
    scaler = Autoscaler(store, Settings(pools=specs), pools=pools)
    active = pool_activity(store)
    assert not active(busy, 5) and not active(quiet, 5)  # no decision recorded yet: idle to the janitor

    scaler.adapt()  # the backlog starts the busy pool's agent; the quiet pool stays at none
    wait_for(lambda: [s.status for s in Ledger(store).shards(job_id)] == ["running"], 90, "the shard running",
             lambda: str(pools[busy].status()))
    scaler.adapt()  # records the running shard and the running agent
    assert list(pools[busy].status().nodes.values()) == [NodeState.RUNNING]
    assert pools[quiet].status().nodes == {}
    assert active(busy, 5)
    assert not active(quiet, 5)
