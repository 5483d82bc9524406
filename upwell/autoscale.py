"""The Autoscaler: observe each pool, ask the pure policy, act, and record why.

Pools are evaluated independently: one failing backend is logged and the others
go on. Policy state is carried between timer runs in Table `scaling` (RowKey
"state"); every decision is stored there too (RowKey = timestamp) so reports can
plot pool size against backlog. Overlapping runs are refused.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict

from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import UpdateMode

from upwell import logs, names, scaling
from upwell.errors import PoolError
from upwell.ledger import Ledger
from upwell.pools.base import PoolSpec, PoolStatus, WorkerPool
from upwell.settings import Settings
from upwell.storage import Storage
from upwell.timeutil import now_iso

log = logs.get("upwell.autoscale")
ACTIVE = ("accepted", "running")


def _price(spec: PoolSpec) -> float:
    try:
        from upwell import cost

        return float(cost.price(spec.price_key, spot=spec.spot_share >= 0.5))
    except Exception:  # noqa: BLE001 - unknown key: the budget cap cannot apply, say so in the reason
        return 0.0


class Autoscaler:
    """Keeps the pool objects and a lock against overlapping runs; all other state is in storage."""

    def __init__(self, storage: Storage, settings: Settings, pools: dict[str, WorkerPool] | None = None,
                 **pool_ctx):
        self.storage = storage
        self.settings = settings
        self.ledger = Ledger(storage)
        self.table = storage.table(names.SCALE_TABLE)
        self.pools = dict(pools or {})
        self.pool_ctx = pool_ctx
        self._lock = threading.Lock()

    def pool(self, spec: PoolSpec) -> WorkerPool:
        if spec.name not in self.pools:
            from upwell.pools import make_pool

            self.pools[spec.name] = make_pool(spec, **self.pool_ctx)
        return self.pools[spec.name]

    def adapt(self) -> dict[str, scaling.Decision]:
        if not self._lock.acquire(blocking=False):
            log.warning("autoscale.overlap_skipped")
            return {}
        try:
            decisions = {}
            for name, spec in self.settings.pools.items():
                try:
                    decisions[name] = self.adapt_pool(spec)
                except Exception as exc:  # noqa: BLE001 - one pool never stops the others
                    log.exception("autoscale.pool_failed", pool=name, error=str(exc)[:300])
            return decisions
        finally:
            self._lock.release()

    def observe(self, spec: PoolSpec, status: PoolStatus) -> scaling.Observation:
        queue = self.storage.queue(names.work_queue(spec.name))
        try:
            approx = queue.get_queue_properties().approximate_message_count or 0
        except ResourceNotFoundError:
            approx = 0
        in_flight = len(self.ledger.running(spec.name))
        # The approximate count includes invisible (leased) messages; those are the in-flight shards.
        visible = max(0, approx - in_flight)
        return scaling.Observation(visible=visible, in_flight=in_flight, nodes=status.alive, idle=status.idle,
                                   preempted_recent=status.preempted, price_per_node_hour=_price(spec),
                                   budget_left_usd=spec.budget_usd, now=_epoch())

    def adapt_pool(self, spec: PoolSpec) -> scaling.Decision:
        pool = self.pool(spec)
        status = pool.status()
        obs = self.observe(spec, status)
        state = self._load_state(spec.name)
        decision = scaling.decide(spec, obs, state)
        message = decision.message
        if decision.target != status.alive or decision.target != status.target:
            try:
                pool.scale_to(decision.target)
            except PoolError as exc:
                message = str(exc)
                log.warning("autoscale.pool_error", pool=spec.name, kind=exc.kind.value, error=message)
        self._save_state(spec.name, decision.state)
        if message or status.message:
            self._tell_jobs(spec.name, message or status.message)
        if decision.target != state.last_target or obs.backlog or decision.target != status.alive or message:
            self._record(spec.name, decision, obs, status, message)
        log.info("autoscale.decision", pool=spec.name, target=decision.target, nodes=status.alive,
                 visible=obs.visible, in_flight=obs.in_flight, reason=decision.reason)
        return decision

    # -- storage of state and events ------------------------------------------------------
    def _load_state(self, pool: str) -> scaling.PolicyState:
        try:
            row = self.table.get_entity(pool, "state")
            return scaling.PolicyState(**json.loads(row["state"]))
        except (ResourceNotFoundError, KeyError, TypeError, ValueError):
            return scaling.PolicyState()

    def _save_state(self, pool: str, state: scaling.PolicyState) -> None:
        self.table.upsert_entity({"PartitionKey": pool, "RowKey": "state", "state": json.dumps(asdict(state))},
                                 mode=UpdateMode.REPLACE)

    def _record(self, pool: str, d: scaling.Decision, obs: scaling.Observation, status: PoolStatus,
                message: str) -> None:
        self.table.upsert_entity({"PartitionKey": pool, "RowKey": now_iso(), "target": d.target,
                                  "nodes": status.alive, "busy": status.count(*_busy()), "visible": obs.visible,
                                  "in_flight": obs.in_flight, "reason": d.reason[:1000], "capped_by": d.capped_by,
                                  "spot": d.spot, "dedicated": d.dedicated, "message": message[:1000]})

    def _tell_jobs(self, pool: str, message: str) -> None:
        """Put a pool's shortfall (quota, capacity, budget) on the status of its active jobs."""
        for job in self.ledger.jobs(*ACTIVE):
            if job.get("pool") == pool and job.get("message") != message:
                self.ledger.update_job(job["PartitionKey"], message=message, message_at=now_iso())


def _busy():
    from upwell.pools.base import NodeState

    return (NodeState.RUNNING,)


def _epoch() -> float:
    import time

    return time.time()
