"""The Autoscaler: observe each pool, ask the pure policy, act, and record why.

Pools are evaluated independently: one failing backend is logged and the others
go on. Policy state is carried between timer runs in Table `scaling` (RowKey
"state"); every decision is stored there too (RowKey = timestamp) so reports can
plot pool size against backlog. Overlapping runs are refused.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict

from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import UpdateMode

from upwell import logs, names
from upwell.errors import BudgetExceeded, PoolError
from upwell.ledger import Ledger
from upwell.scale import policy as scaling
from upwell.scale.pools.base import NodeState, PoolSpec, PoolStatus, WorkerPool
from upwell.settings import Settings
from upwell.storage import Storage
from upwell.timeutil import now_iso

log = logs.get("upwell.scale.autoscaler")
ACTIVE = ("accepted", "running")
# Seconds from asking for a node to an agent taking work, unless options.boot_s says otherwise. A Slurm
# cluster's nodes are already up (a CycleCloud nodearray that powers nodes up: set boot_s).
BOOT_S = {"local": 2.0, "slurm": 0.0}


def _prices(spec: PoolSpec) -> tuple[float, float | None, int, str]:
    """(pay-as-you-go $/h, spot $/h, vCPUs per node, quota family) from the dated price table."""
    try:
        from upwell import cost

        row = cost.load().get(spec.price_key)
        return float(row.payg), float(row.spot) if row.spot else None, int(row.vcpus), row.quota_family
    except Exception:  # noqa: BLE001 - an unknown key: no budget cap can apply; the reason says $0/h
        return 0.0, None, 0, ""


def _interval_s(schedule: str) -> float:
    """Seconds between two runs of the scale timer (NCRONTAB, or %SETTING% already resolved)."""
    try:
        from datetime import UTC, datetime

        from upwell.ncrontab import parse

        a, b = parse(schedule).occurrences(datetime.now(UTC), 2)
        return max(1.0, (b - a).total_seconds())
    except Exception:  # noqa: BLE001
        return 30.0


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
            from upwell.scale.pools import make_pool

            ctx = {"busy_nodes": self.busy_nodes, **self.pool_ctx}
            self.pools[spec.name] = make_pool(spec, **ctx)
        return self.pools[spec.name]

    def busy_nodes(self, pool: str) -> set[str]:
        """Node ids the ledger shows running a shard: a backend never removes these."""
        return {r["node"] for r in self.ledger.running(pool) if r.get("node")}

    def adapt(self) -> dict[str, scaling.Decision]:
        if not self._lock.acquire(blocking=False):
            log.warning("autoscale.overlap_skipped")
            return {}
        try:
            decisions = {}
            active = list(self.ledger.jobs(*ACTIVE))  # one scan of the job rows per run, not per pool
            for name, spec in self.settings.pools.items():
                try:
                    decisions[name] = self.adapt_pool(spec, [j for j in active if j.get("pool") == name])
                except Exception as exc:  # noqa: BLE001 - one pool never stops the others
                    log.exception("autoscale.pool_failed", pool=name, error=str(exc)[:300])
            return decisions
        finally:
            self._lock.release()

    def observe(self, spec: PoolSpec, status: PoolStatus, jobs: list[dict],
                pool: WorkerPool | None = None) -> scaling.Observation:
        """What the policy needs about one pool; ``jobs`` are the pool's active job rows."""
        queue = self.storage.queue(names.work_queue(spec.name))
        try:
            approx = queue.get_queue_properties().approximate_message_count or 0
        except ResourceNotFoundError:
            approx = 0
        running = self.ledger.running(spec.name)
        in_flight = len(running)
        # The approximate count includes invisible (leased) messages; those are the in-flight shards.
        visible = max(0, approx - in_flight)
        busy = {r.get("node") for r in running}
        payg, spot_price, cores, family = _prices(spec)
        quota = self._quota(pool)
        return scaling.Observation(
            visible=visible, in_flight=in_flight, nodes=status.alive,
            # A backend may not see the agent's work (Batch start-task agents look idle): trust the ledger too.
            idle=max(0, min(status.idle, status.alive - len(busy))),
            preempted_recent=status.preempted,
            spot_nodes=status.spot, budget_left_usd=_budget_left(spec, jobs), price_per_node_hour=payg,
            spot_price_per_node_hour=spot_price, cores_per_node=cores, quota_family=quota.get("family") or family,
            quota_cores=quota.get("cores"),
            spot_quota_nodes=(quota["spot_cores"] // cores) if quota.get("spot_cores") is not None and cores else None,
            task_s=_task_s(jobs), boot_s=float(spec.options.get("boot_s", BOOT_S.get(spec.backend, 360.0))),
            interval_s=_interval_s(self.settings.scale_schedule), now=time.time())

    @staticmethod
    def _quota(pool: WorkerPool | None) -> dict:
        quota = getattr(pool, "quota", None)
        if quota is None:
            return {}
        try:
            return quota() or {}
        except PoolError as exc:
            log.warning("autoscale.quota_unreadable", pool=pool.spec.name, error=str(exc)[:200])
            return {}

    def adapt_pool(self, spec: PoolSpec, jobs: list[dict]) -> scaling.Decision:
        pool = self.pool(spec)
        status = pool.status()
        obs = self.observe(spec, status, jobs, pool)
        state = self._load_state(spec.name)
        decision = scaling.decide(spec, obs, state)
        message = decision.message
        if decision.target != status.alive or decision.target != status.target:
            try:
                pool.scale_to(decision.target, spot=decision.spot)
            except PoolError as exc:
                message = str(exc)
                log.warning("autoscale.pool_error", pool=spec.name, kind=exc.kind.value, error=message)
        self._save_state(spec.name, decision.state)
        if message or status.message:
            self._tell_jobs(jobs, message or status.message)
        if decision.target != state.last_target or obs.backlog or decision.target != status.alive or message:
            self._record(spec.name, decision, obs, status, message)
        idle = not obs.backlog and decision.target == status.alive == state.last_target
        (log.debug if idle else log.info)("autoscale.decision", pool=spec.name, target=decision.target,
                                          nodes=status.alive, visible=obs.visible, in_flight=obs.in_flight,
                                          reason=decision.reason)
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
                                  "nodes": status.alive, "busy": status.count(NodeState.RUNNING),
                                  "visible": obs.visible,
                                  "in_flight": obs.in_flight, "reason": d.reason[:1000], "capped_by": d.capped_by,
                                  "spot": d.spot, "dedicated": d.dedicated, "message": message[:1000]})

    def _tell_jobs(self, jobs: list[dict], message: str) -> None:
        """Put a pool's shortfall (quota, capacity, budget) on the status of its active jobs."""
        for job in jobs:
            if job.get("message") != message:
                self.ledger.update_job(job["PartitionKey"], message=message, message_at=now_iso())


def _budget_left(spec: PoolSpec, jobs: list[dict]) -> float | None:
    """The tighter of the pool's budget and its active jobs' budgets (None when nothing is capped)."""
    from upwell import cost

    lefts = []
    if spec.budget_usd is not None:
        lefts.append(max(0.0, spec.budget_usd - sum(float(j.get("spent_usd") or 0) for j in jobs)))
    budgets = [j for j in jobs if j.get("budget_usd") is not None]
    if budgets and len(budgets) == len(jobs):  # a job without a budget leaves the pool uncapped
        total = 0.0
        for j in budgets:
            try:
                total += cost.remaining(float(j["budget_usd"]), float(j.get("spent_usd") or 0))
            except BudgetExceeded:
                continue
        lefts.append(total)
    return min(lefts) if lefts else None


def _task_s(jobs: list[dict]) -> float | None:
    estimates = [float(j["estimate_node_seconds_per_shard"]) for j in jobs if j.get("estimate_node_seconds_per_shard")]
    return sum(estimates) / len(estimates) if estimates else None

