"""The scaling policies the simulator compares: upwell's and two documented baselines.

Each policy is evaluated on its own schedule and returns a ``Plan``: how many spot
and dedicated workers it wants, and how the platform removes workers when the
plan is lower than what runs:

- ``idle``: only workers that hold no task go (booting ones first) - upwell;
- ``taskcompletion``: booting and idle go at once, busy ones finish their task
  first and take no new one - Azure Batch's ``$NodeDeallocationOption``;
- ``kill``: Kubernetes' ReplicaSet order, not-ready pods first, then the
  newest ready pods, busy or not; a killed task goes back to the queue and its
  work since the last checkpoint is lost - KEDA/HPA.

Baselines are modelled from their documentation, with their defaults:

* Azure Batch autoscale, the docs' ``$PendingTasks`` sample formula, evaluated
  every 5 minutes (the minimum interval) at a phase drawn from the seed;
  ``$PendingTasks`` (queued + running tasks) is sampled every 30 s. The docs'
  formula counts tasks; with more than one task slot per node it is divided by
  the slots.
* KEDA's azure-queue scaler feeding the HPA: metric polled every 30 s, the HPA
  syncs every 15 s, ``ceil(metric / queueLength)`` with queueLength = tasks per
  worker, 10 % tolerance, scale-up at most max(2x, +4) per sync, scale-down
  stabilization 300 s (the highest recommendation in the window), scale to zero
  after ``cooldownPeriod`` 300 s without activity. ``visibleonly`` counts visible
  messages by Peek (so in-flight work is invisible) and falls back to the
  approximate count (visible + in-flight) at 32 or more; ``all`` (KEDA's default
  since the strategy was added) always uses the approximate count.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from upwell.pools.base import PoolSpec
from upwell.scale.policy import Observation, PolicyState, decide, split

if TYPE_CHECKING:  # pragma: no cover
    from upwell.scale.poolsim import Sim


@dataclass(frozen=True)
class Plan:
    spot: int
    dedicated: int
    mode: str  # "idle" | "taskcompletion" | "kill"

    @property
    def total(self) -> int:
        return self.spot + self.dedicated


class UpwellPolicy:
    """scaling.decide, fed what the scale handler observes: queue, ledger, pool, prices."""

    name = "upwell"
    interval_s = 30.0  # the scale timer on Azure (UPWELL_SCALE_SCHEDULE: every 30 s)

    def __init__(self, spec: PoolSpec, seed: int = 0, budget_usd: float | None = None, on_ingest: bool = True):
        self.spec = spec
        self.state = PolicyState()
        self.budget_usd = budget_usd
        self.first_eval_s = 0.0
        self.last_reason = ""
        # UPWELL_SCALE_ON_INGEST (on in the Bicep deployment and under `upwell up`): ingest runs a scale pass as
        # soon as it accepted a job, so the simulation evaluates at each arrival too, not only on the timer.
        self.on_arrival = on_ingest

    def sample(self, sim: Sim) -> None:
        pass

    def evaluate(self, sim: Sim) -> Plan:
        v = sim.view()
        obs = Observation(
            visible=v.visible, in_flight=v.running, nodes=v.alive, idle=max(v.alive - v.busy, 0), gangs=v.gangs,
            preempted_recent=sim.preemptions_since(sim.now - 600),
            budget_left_usd=None if self.budget_usd is None else self.budget_usd - sim.cost(),
            price_per_node_hour=sim.price, spot_price_per_node_hour=sim.spot_price, spot_nodes=v.spot,
            task_s=sim.estimate_s, boot_s=sim.mean_boot_s(), interval_s=self.interval_s, now=sim.now,
            arrivals=sim.active_arrivals(self.state.last_arrival))
        d = decide(self.spec, obs, self.state)
        self.state, self.last_reason = d.state, d.reason
        return Plan(d.spot, d.dedicated, "idle")


class BatchFormulaPolicy:
    """The Batch docs' sample autoscale formula:

    $samples = $PendingTasks.GetSamplePercent(TimeInterval_Minute * 5);
    $tasks = $samples < 70 ? max(0, $PendingTasks.GetSample(1)) :
             max($PendingTasks.GetSample(1), avg($PendingTasks.GetSample(TimeInterval_Minute * 5)));
    $targetVMs = $tasks > 0 ? $tasks : max(0, $TargetDedicatedNodes / 2);
    $TargetDedicatedNodes = max(0, min($targetVMs, cap));
    $NodeDeallocationOption = taskcompletion;
    """

    name = "batch-formula"
    interval_s = 300.0
    sample_s = 30.0

    def __init__(self, spec: PoolSpec, seed: int = 0, budget_usd: float | None = None):
        self.spec = spec
        self.target = 0
        # The pool has existed for a while: five minutes of zero samples, then a phase from the seed.
        self.samples: deque[tuple[float, int]] = deque((-t, 0) for t in range(300, 0, -30))
        self.first_eval_s = random.Random(f"batch-phase-{seed}").uniform(0, self.interval_s)

    def sample(self, sim: Sim) -> None:
        v = sim.view()
        self.samples.append((sim.now, v.visible + v.busy))
        while self.samples and self.samples[0][0] <= sim.now - 600:
            self.samples.popleft()

    def evaluate(self, sim: Sim) -> Plan:
        window = [n for t, n in self.samples if t > sim.now - 300]
        percent = 100.0 * len(window) / (300 / self.sample_s)
        last = self.samples[-1][1] if self.samples else 0
        tasks = max(0, last) if percent < 70 else max(last, sum(window) / len(window))
        slots = max(self.spec.tasks_per_node, 1)
        target = math.ceil(tasks / slots) if tasks > 0 else int(max(0, self.target / 2))
        self.target = max(0, min(target, self.spec.max_nodes))
        spot, ded = split(self.target, self.spec.spot_share)
        return Plan(spot, ded, "taskcompletion")


class KedaPolicy:
    """KEDA's azure-queue scaler and the HPA it drives (see the module docstring)."""

    interval_s = 15.0  # HPA sync period
    poll_s = 30.0  # KEDA pollingInterval
    stabilization_s = 300.0  # HPA scale-down stabilization window
    cooldown_s = 300.0  # KEDA cooldownPeriod
    tolerance = 0.1

    def __init__(self, spec: PoolSpec, seed: int = 0, budget_usd: float | None = None, strategy: str = "visibleonly"):
        self.spec = spec
        self.strategy = strategy
        self.name = "keda" if strategy == "visibleonly" else f"keda-{strategy}"
        self.replicas = 0
        self.metric = 0
        self.last_poll = -math.inf
        self.last_active = -math.inf
        self.recs: deque[tuple[float, int]] = deque()
        self.first_eval_s = 0.0

    def sample(self, sim: Sim) -> None:
        pass

    def _poll(self, sim: Sim) -> None:
        v = sim.view()
        peeked = v.visible
        self.metric = v.visible + v.busy if self.strategy == "all" or peeked >= 32 else peeked
        self.last_poll = sim.now
        if self.metric > 0:
            self.last_active = sim.now

    def evaluate(self, sim: Sim) -> Plan:
        if sim.now - self.last_poll >= self.poll_s:
            self._poll(sim)
        if self.metric == 0 and sim.now - self.last_active >= self.cooldown_s:
            self.replicas, self.recs = 0, deque()  # KEDA deactivates: replicas to zero
        elif self.replicas == 0 and self.metric > 0:
            self.replicas = 1  # KEDA activates; the HPA takes it from 1
        elif self.replicas > 0:
            self.replicas = self._hpa(sim.now)
        spot, ded = split(self.replicas, self.spec.spot_share)
        return Plan(spot, ded, "kill")

    def _hpa(self, now: float) -> int:
        per = max(self.spec.tasks_per_node, 1)
        cur = self.replicas
        want = min(max(math.ceil(self.metric / per), 1), self.spec.max_nodes)
        if abs(self.metric / (per * cur) - 1.0) <= self.tolerance:
            want = cur
        self.recs.append((now, want))
        while self.recs and self.recs[0][0] < now - self.stabilization_s:
            self.recs.popleft()
        if want < cur:
            want = min(cur, max(r for _, r in self.recs))
        return min(want, max(2 * cur, cur + 4))


POLICIES = {
    "upwell": UpwellPolicy,
    "batch-formula": BatchFormulaPolicy,
    "keda": KedaPolicy,
    "keda-all": lambda spec, seed=0, budget_usd=None: KedaPolicy(spec, seed, budget_usd, strategy="all"),
}
DEFAULT_POLICIES = ("upwell", "batch-formula", "keda", "keda-all")


def make_policy(name: str, spec: PoolSpec, seed: int = 0, budget_usd: float | None = None):
    from upwell.errors import ConfigError

    try:
        factory = POLICIES[name]
    except KeyError:
        raise ConfigError(f"policy {name!r} is not known; known: {sorted(POLICIES)}") from None
    return factory(spec, seed, budget_usd)


def pool_spec(name: str, *, max_nodes: int, tasks_per_node: int = 1, spot_share: float = 0.0,
              price_key: str = "local", **fields) -> PoolSpec:
    """The PoolSpec the simulation runs under: upwell's defaults, the trace's pool."""
    return replace(PoolSpec(name), max_nodes=max_nodes, tasks_per_node=tasks_per_node, spot_share=spot_share,
                   price_key=price_key, **fields)
