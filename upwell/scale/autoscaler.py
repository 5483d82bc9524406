"""The Autoscaler: observe each pool, ask the pure policy, act, and record why.

Pools are evaluated independently: one failing backend is logged and the others
go on. Policy state is carried between timer runs in the scaling log
(upwell.scalelog); every decision that moved something is recorded there too, so
reports can plot pool size against backlog. Overlapping runs are refused.

An idle run reads only what can change without a write the run would see elsewhere (issue 24, item 4): the
open-jobs index (a new upload, a cancel, a job ending), each pool's queue length (the signal) and the
backend's node view. When those equal what a run found settled last time (no job, no message, the same
nodes, and a decision that changed no state: target = nodes = last target, no vote under way), the pool's
policy state is neither read nor written, and the nodes table is read only while the pool has nodes (a
beat going stale is how a node dies). A state that does not change is never written (an unchanged
decision need not be); a run that acts still claims it under its ETag. The memo of the settled inputs
(``_Settled``) is a cache of "nothing moved", kept per process: it is never policy state, and losing it
(a new instance) costs one full run.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict, dataclass

from upwell import logs, names
from upwell.errors import BudgetExceeded, ConfigError, PoolError
from upwell.ledger import Ledger
from upwell.nodelog import Liveness, NodeLog
from upwell.pools.base import NodeState, PoolSpec, PoolStatus, WorkerPool
from upwell.rows import ACTIVE_JOB, JobRow, JobState, ShardRow
from upwell.scale import gangs as gang_count
from upwell.scale import nodes as node_step
from upwell.scale import policy as scaling
from upwell.scalelog import DecisionRow, ScalingLog
from upwell.settings import Settings
from upwell.storage import Storage
from upwell.timeutil import now_iso, parse_iso

log = logs.get("upwell.scale.autoscaler")
ACTIVE = ACTIVE_JOB


def _prices(spec: PoolSpec) -> tuple[float, float | None, int, str]:
    """(pay-as-you-go $/h, spot $/h, vCPUs per node, quota family) from the dated price table."""
    try:
        from upwell import cost

        row = cost.load().get(spec.price_key)
        return float(row.payg), float(row.spot) if row.spot else None, int(row.vcpus), row.quota_family
    except ConfigError:  # an unknown key: no budget cap can apply; the reason says $0/h
        return 0.0, None, 0, ""


def _interval_s(schedule: str) -> float:
    """Seconds between two runs of the scale timer (NCRONTAB, or %SETTING% already resolved)."""
    try:
        from datetime import UTC, datetime

        from upwell.ncrontab import parse

        a, b = parse(schedule).occurrences(datetime.now(UTC), 2)
        return max(1.0, (b - a).total_seconds())
    except (ConfigError, ValueError):  # a schedule the host would refuse: the Azure default interval
        return 30.0


@dataclass(frozen=True)
class _Settled:
    """A pool's last full run that found nothing to do: the inputs it saw (``key``), its decision, and
    whether the pool had nodes whose rows must still be read for a stale beat."""

    key: tuple
    decision: scaling.Decision
    nodes: bool


def _settled_key(approx: int, status: PoolStatus) -> tuple:
    """What an idle run compares with the last settled one: the queue length and the backend's nodes."""
    return (approx, status.target, tuple(sorted((k, str(v)) for k, v in status.nodes.items())), status.spot,
            status.preempted, status.message)


class Autoscaler:
    """Keeps the pool objects, a lock against overlapping runs, the open jobs the last run read
    (``open_rows``: the scale timer's waiting-manifest recheck reuses them) and, per pool, the inputs of its
    last settled run (``_settled``, see the module docstring); all policy state is in storage."""

    def __init__(self, storage: Storage, settings: Settings, pools: dict[str, WorkerPool] | None = None,
                 liveness: Liveness | None = None, **pool_ctx):
        self.storage = storage
        self.settings = settings
        self.ledger = Ledger(storage)
        self.log = ScalingLog(storage)
        self.nodes = NodeLog(storage)  # heartbeats and drain marks (upwell.scale.nodes)
        self.liveness = liveness or Liveness.from_env(os.environ)
        self.pools = dict(pools or {})
        self.pool_ctx = pool_ctx
        self._lock = threading.Lock()
        self._settled: dict[str, _Settled] = {}
        self.open_rows: list[JobRow] | None = None

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
            # The open jobs once per run, not per pool, through the ledger's index (never a table scan).
            # Jobs still being ingested are read too: their shard count is written before their messages
            # are sent (the policy's prewarm and arrivals). All open jobs: the timer's recheck of waiting
            # manifests reuses this read (``open_rows``).
            rows = self.open_rows = self.ledger.open_jobs()
            active = [j for j in rows if j.status in ACTIVE]
            ingesting = [j for j in rows if j.status == JobState.INGESTING and j.shards_total > 0]
            for name, spec in self.settings.pools.items():
                try:
                    decisions[name] = self.adapt_pool(spec, [j for j in active if j.pool == name],
                                                      [j for j in ingesting if j.pool == name])
                except Exception as exc:  # one pool never stops the others
                    log.exception("autoscale.pool_failed", pool=name, error=str(exc)[:300])
            return decisions
        finally:
            self._lock.release()

    def observe(self, spec: PoolSpec, status: PoolStatus, jobs: list[JobRow], pool: WorkerPool,
                running: list[ShardRow] | None = None, ingesting: list[JobRow] = (),
                approx: int | None = None) -> scaling.Observation:
        """What the policy needs about one pool; ``jobs`` are the pool's active job rows, ``running`` its
        running shard rows (read from the ledger when not given), ``ingesting`` the rows of its jobs whose
        shards are being enqueued and ``approx`` the queue's length (read when not given). Shards of several
        nodes are told apart by their job rows' ``nodes`` (upwell.scale.gangs): no read per shard."""
        if approx is None:
            approx = self.storage.queue_length(names.work_queue(spec.name))
        running = self.ledger.running(spec.name) if running is None else running
        in_flight = len(running)
        # The approximate count includes invisible (leased) messages; those are the in-flight shards.
        visible = max(0, approx - in_flight)
        busy = {r.node for r in running}
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
            task_s=_task_s([*jobs, *ingesting]), boot_s=pool.boot_s(),
            interval_s=_interval_s(self.settings.scale_schedule), now=time.time(),
            arrivals=_arrivals([*jobs, *ingesting]), announced=sum(j.shards_total for j in ingesting),
            gangs=gang_count.backlog(visible, jobs, ingesting, [r.job_id for r in running]))

    @staticmethod
    def _quota(pool: WorkerPool) -> dict:
        try:
            return pool.quota() or {}
        except PoolError as exc:
            log.warning("autoscale.quota_unreadable", pool=pool.spec.name, error=str(exc)[:200])
            return {}

    def adapt_pool(self, spec: PoolSpec, jobs: list[JobRow], ingesting: list[JobRow] = ()) -> scaling.Decision:
        pool = self.pool(spec)
        approx = self.storage.queue_length(names.work_queue(spec.name))
        running = self.ledger.running(spec.name, jobs)  # once per pool per run: the policy's and the backend's view
        busy = {r.node for r in running if r.node}  # a backend never removes these nodes
        status = pool.status(busy=busy)
        key = _settled_key(approx, status)
        quiet = self._quiet(spec.name, pool, key, status, bool(jobs or ingesting))
        if quiet is not None:
            return quiet
        obs = self.observe(spec, status, jobs, pool, running, list(ingesting), approx=approx)
        state, etag = self._read_state(spec.name)
        decision = scaling.decide(spec, obs, state)
        # While a gang waits, ask on every run: which allocations the target holds changes with the same total.
        waiting = any(g.waiting for g in obs.gangs)
        acts = decision.target != status.alive or decision.target != status.target or bool(decision.gangs and waiting)
        if (acts or decision.state != state) and not self._claim_state(spec.name, decision.state, etag):
            # Another run (the timer on one instance, an ingest nudge on another) saved its decision since
            # this one read the state: it acted on the same backlog, so this run does not act twice.
            log.info("autoscale.concurrent_run_skipped", pool=spec.name, target=decision.target)
            return decision
        message = decision.message
        # Dead and drained nodes go by id; surplus idle agents are marked draining; agents that beat are left
        # to that drain, never to scale_to's own scale-in.
        step = node_step.tend(pool, self.nodes, self.liveness, status, busy, decision.target)
        if acts:
            try:
                pool.scale_to(decision.target, spot=decision.spot, busy=busy | step.protected,
                              gangs=gang_count.as_mapping(decision.gangs))
            except PoolError as exc:
                message = str(exc)
                log.warning("autoscale.pool_error", pool=spec.name, kind=exc.kind.value, error=message)
        if message or status.message:
            self._tell_jobs(jobs, message or status.message)
        if decision.target != state.last_target or obs.backlog or decision.target != status.alive or message:
            self._record(spec.name, decision, obs, status, message)
        idle = not obs.backlog and decision.target == status.alive == state.last_target
        if (idle and not acts and not message and not jobs and not ingesting and not approx
                and decision.state == state and not (step.dead or step.drained or step.marked)):
            self._settled[spec.name] = _Settled(key, decision, bool(step.protected) or status.alive > 0)
        (log.debug if idle else log.info)("autoscale.decision", pool=spec.name, target=decision.target,
                                          nodes=status.alive, visible=obs.visible, in_flight=obs.in_flight,
                                          reason=decision.reason)
        return decision

    def _quiet(self, name: str, pool: WorkerPool, key: tuple, status: PoolStatus,
               has_jobs: bool) -> scaling.Decision | None:
        """The pool's last settled decision when nothing it saw has moved (the module docstring); None: a full
        run is due (and the memo is dropped until one settles again)."""
        settled = self._settled.pop(name, None)
        if settled is None or settled.key != key or has_jobs or not self._still_settled(pool, settled, status):
            return None
        self._settled[name] = settled
        return settled.decision

    def _still_settled(self, pool: WorkerPool, settled: _Settled, status: PoolStatus) -> bool:
        """An idle run over the inputs of the last settled one: its nodes' rows only while it has nodes (a
        stale beat is a dead node, removed now). False when the node step changed anything."""
        if not settled.nodes:
            return True
        step = node_step.tend(pool, self.nodes, self.liveness, status, set(), settled.decision.target)
        return not (step.dead or step.drained or step.marked)

    # -- storage of state and events ------------------------------------------------------
    def _read_state(self, pool: str) -> tuple[scaling.PolicyState, str | None]:
        """The last run's policy state and its row's ETag (None: no row yet)."""
        row = self.log.policy(pool)
        if row is None:
            return scaling.PolicyState(), None
        try:
            return scaling.PolicyState(**row.state), row.etag
        except TypeError:  # a row from an older policy: start afresh, keep the claim
            return scaling.PolicyState(), row.etag

    def _claim_state(self, pool: str, state: scaling.PolicyState, etag: str | None) -> bool:
        """Save this run's state only if no other run saved one since it was read: the timer and the
        ingest nudge may run at once on different instances, and the in-process lock cannot see that.
        False: another run won, and its decision stands."""
        return self.log.claim_policy(pool, asdict(state), etag)

    def _record(self, pool: str, d: scaling.Decision, obs: scaling.Observation, status: PoolStatus,
                message: str) -> None:
        self.log.record(DecisionRow(pool, now_iso(), target=d.target, nodes=status.alive,
                                 busy=status.count(NodeState.RUNNING), visible=obs.visible,
                                 in_flight=obs.in_flight, reason=d.reason[:1000], capped_by=d.capped_by,
                                 spot=d.spot, dedicated=d.dedicated, message=message[:1000]))

    def _tell_jobs(self, jobs: list[JobRow], message: str) -> None:
        """Put a pool's shortfall (quota, capacity, budget) on the status of its active jobs."""
        for job in jobs:
            if job.message != message:
                self.ledger.update_job(job.job_id, message=message, message_at=now_iso())


def _budget_left(spec: PoolSpec, jobs: list[JobRow]) -> float | None:
    """The tighter of the pool's budget and its active jobs' budgets (None when nothing is capped)."""
    from upwell import cost

    lefts = []
    if spec.budget_usd is not None:
        lefts.append(max(0.0, spec.budget_usd - sum(j.spent_usd for j in jobs)))
    budgets = [j for j in jobs if j.budget_usd is not None]
    if budgets and len(budgets) == len(jobs):  # a job without a budget leaves the pool uncapped
        total = 0.0
        for j in budgets:
            try:
                total += cost.remaining(j.budget_usd, j.spent_usd)
            except BudgetExceeded:
                continue
        lefts.append(total)
    return min(lefts) if lefts else None


def _task_s(jobs: list[JobRow]) -> float | None:
    """The mean run time of a shard of the jobs: the manifest's per-shard estimate (a node's seconds), else
    ingest's estimate over the shards and over the nodes each shard holds (upwell.cost.forecast)."""
    estimates = [j.estimate_node_seconds_per_shard or (j.estimate_node_seconds / j.shards_total / max(j.nodes or 1, 1)
                                                       if j.shards_total else 0.0) for j in jobs]
    estimates = [e for e in estimates if e > 0]
    return sum(estimates) / len(estimates) if estimates else None


def _arrivals(jobs: list[JobRow]) -> tuple[tuple[float, int], ...]:
    """(when the job was created, its shards) of each job with a known shard count, for the policy to learn
    the arrival pattern from (it counts only those newer than the last arrival it has seen)."""
    out = []
    for j in jobs:
        try:
            at = parse_iso(j.created_at)
        except ValueError:
            at = None
        if at is not None and j.shards_total > 0:
            out.append((at.timestamp(), j.shards_total))
    return tuple(sorted(out))

