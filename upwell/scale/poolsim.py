"""A discrete-event simulation of one worker pool under a workload trace (upwell.scale.traces).

Policies (upwell.scale.baselines) are compared on the same trace with the same random draws
(``Draws``): the k-th node any policy asks for boots in the same time, and a spot node's eviction
comes the same time after it booted.

The model:
- tasks arrive on the queue (the trace), workers take them first-come first-served; a task of k nodes (a
  gang, upwell.shape) starts once k nodes are idle, on all of them at once, and a task behind it that fits
  the idle nodes goes first (backfill); losing any of its nodes sends it back to the queue and frees the rest;
- a node asked for boots for a delay drawn from a clipped lognormal (minutes,
  e.g. median 6, 3-30 as on Batch) and is billed from the request until it is gone;
- a spot node may be evicted (Poisson, per spot node-hour) with 30 s notice: it
  takes no task in the notice; its task goes back to the queue, keeping the work
  up to its last checkpoint; the platform replaces the node (the target is kept);
- upwell's policy sees what the Autoscaler reads: the queue, the pool, the gangs among the queued and running
  tasks (upwell.scale.gangs, as the Autoscaler splits them by their job rows), the active jobs' creation times (the
  arrivals it learns from, in its PolicyState only) and their per-shard estimate (the trace's mean duration,
  as ingest learns it from earlier results); it is evaluated on its timer and at each arrival (ingest's scale
  nudge, UPWELL_SCALE_ON_INGEST, on in the Bicep deployment);
- the policy's Plan is applied at once: asked-for nodes start booting; removal
  follows the plan's mode (idle / taskcompletion / kill, see ``Sim._shrink``);
- with a budget in the trace, no task is dispatched once the spend reaches it
  (upwell stops dispatching a job over its budget);
- under ``kill`` (Kubernetes) a node whose pod went stays billed, idle, for
  ``linger_s`` (cluster-autoscaler's scale-down-unneeded-time, 10 min) and is
  reused at once if a pod needs a node in that time.

A run ends in a ``Result`` (upwell.scale.sim_results).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from upwell.scale.baselines import Plan
from upwell.scale.gangs import Gang
from upwell.scale.sim_results import Result
from upwell.scale.traces import Trace, estimate_s

NOTICE_S = 30.0  # spot eviction notice
SAMPLE_S = 30.0  # time-series and Batch metric sampling
LINGER_S = 600.0  # cluster-autoscaler scale-down-unneeded-time default


@dataclass
class Task:
    """One task of the trace across its attempts: when it was queued, how long it waited, the work kept."""

    id: int
    arrival: float
    duration: float
    queued_at: float
    waited: float = 0.0
    done_work: float = 0.0  # checkpointed progress kept across attempts
    start: float | None = None
    end: float | None = None
    lost: float = 0.0
    nodes: int = 1  # nodes it holds at once (a gang)
    held: list[Node] = field(default_factory=list)  # the nodes of its current attempt


@dataclass
class Node:
    """One node from its request until it is gone; ``state`` is its place in the pool's life cycle."""

    id: int
    spot: bool
    requested: float
    ready_at: float
    state: str = "booting"  # booting | idle | busy | draining | linger | gone
    task: Task | None = None
    epoch: int = 0  # invalidates a stale "done" event after a kill or eviction
    since: float = 0.0  # when the current idle/linger stretch began
    noticed: bool = False  # eviction notice received: takes no task
    orphan: bool = False  # its pod went while it booted (Kubernetes): lingers once ready
    pod_ready: float = 0.0  # when the worker on it last became ready (Kubernetes' deletion order)
    gone_at: float | None = None
    run: int = 0  # counts the attempts it has started: a "done" event of an earlier one is stale


@dataclass(frozen=True)
class View:
    """What a policy reads of the pool at one instant: the queue and the node counts; ``running`` tasks and
    the gangs among the queued and running ones (a gang's task holds several busy nodes)."""

    visible: int
    busy: int  # nodes
    alive: int  # booting + idle + busy (not leaving)
    booting: int
    spot: int
    running: int = 0  # tasks
    gangs: tuple[Gang, ...] = ()



class Draws:
    """Common random numbers: the k-th node's boot delay and eviction delay, per seed."""

    def __init__(self, trace: Trace, seed: int):
        self.trace = trace
        self.rng = random.Random(f"{trace.name}-nodes-{seed}")
        self.boots: list[float] = []
        self.evicts: list[float] = []

    def boot_s(self, k: int) -> float:
        t = self.trace
        while len(self.boots) <= k:
            minutes = t.boot_median_min * math.exp(self.rng.gauss(0, t.boot_sigma))
            booting = t.backend != "slurm"  # the draw is made anyway: the eviction draws stay aligned
            self.boots.append(60 * min(max(minutes, t.boot_min_min), t.boot_max_min) if booting else 0.0)
            rate = t.evictions_per_spot_node_hour / 3600
            self.evicts.append(self.rng.expovariate(rate) if rate > 0 else math.inf)
        return self.boots[k]

    def evict_s(self, k: int) -> float:
        self.boot_s(k)
        return self.evicts[k]


class Sim:
    """One policy on one trace. State: the clock, the event heap, nodes, the queue, counters."""

    def __init__(self, trace: Trace, policy: Any, tasks: list[tuple[float, float]], draws: Draws,
                 linger_s: float = LINGER_S):
        self.trace, self.policy, self.draws = trace, policy, draws
        self.linger_s = linger_s
        self.price, self.spot_price = trace.prices()
        self.now = 0.0
        self.events: list[tuple[float, int, str, Any]] = []
        self.seq = 0
        self.nodes: list[Node] = []
        self.queue: deque[Task] = deque()
        self.tasks = [Task(i, a, d, a, nodes=k) for i, (a, d, k) in enumerate(tasks)]
        self.has_gangs = any(t.nodes > 1 for t in self.tasks)
        self.done = 0
        self.preemptions: list[float] = []
        self.idle_s = 0.0
        self.finished_durations: list[float] = []
        self.nudged_at: float | None = None
        self.estimate_s = estimate_s(trace)  # the job rows' per-shard estimate, known from ingest on
        self.arrived = 0  # tasks[:arrived] have arrived (tasks are sorted by arrival)
        self.series: dict[str, list[float]] = {"t_min": [], "backlog": [], "visible": [], "nodes": [], "busy": []}
        for task in self.tasks:
            self._at(task.arrival, "arrive", task)
        self._at(getattr(policy, "first_eval_s", 0.0), "eval", None)
        self._at(0.0, "sample", None)

    # -- events -----------------------------------------------------------------------
    def _at(self, t: float, kind: str, payload: Any) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, payload))

    def run(self, max_s: float) -> Result:
        while self.events:
            t, _, kind, payload = heapq.heappop(self.events)
            if t > max_s:
                break
            self.now = t
            getattr(self, f"_on_{kind}")(payload)
            if self.done == len(self.tasks) and not any(n.state != "gone" for n in self.nodes):
                break
        return self._result()

    def _on_arrive(self, task: Task) -> None:
        task.queued_at = self.now
        self.queue.append(task)
        self._dispatch()
        if getattr(self.policy, "on_arrival", False) and self.nudged_at != self.now:
            self.nudged_at = self.now  # the ingest nudge: one scale pass for the arrivals of this instant
            self._at(self.now, "nudge", None)

    def _on_nudge(self, _: Any) -> None:
        self.apply(self.policy.evaluate(self))

    def _on_ready(self, node: Node) -> None:
        if node.state != "booting":
            return
        if node.orphan:
            self._set(node, "linger")
            self._at(self.now + self.linger_s, "release", (node, node.epoch))
            return
        self._set(node, "idle")
        node.pod_ready = self.now
        delay = self.draws.evict_s(node.id) if node.spot else math.inf
        if delay < math.inf:
            self._at(self.now + max(delay - NOTICE_S, 0.0), "notice", (node, node.epoch))
            self._at(self.now + delay, "evict", (node, node.epoch))
        self._dispatch()

    def _on_done(self, payload: tuple[Node, int, int]) -> None:
        node, epoch, run = payload
        if epoch != node.epoch or node.task is None or run != node.run:
            return
        task = node.task
        task.end = self.now
        self.done += 1
        self.finished_durations.append(task.duration)
        self._free(task)
        self._dispatch()

    def _free(self, task: Task, but: Node | None = None) -> None:
        """The nodes of ``task``'s attempt, ``but`` one, take no part in it any more: idle, or gone if draining."""
        for member in task.held:
            if member.task is task:
                member.task = None
                if member is but:
                    continue
                if member.state == "draining":
                    self._gone(member)
                else:
                    self._set(member, "idle")
        task.held = []

    def _on_notice(self, payload: tuple[Node, int]) -> None:
        node, epoch = payload
        if epoch == node.epoch and node.state in ("idle", "busy"):
            node.noticed = True

    def _on_evict(self, payload: tuple[Node, int]) -> None:
        node, epoch = payload
        if epoch != node.epoch or node.state in ("gone", "linger"):
            return
        self.preemptions.append(self.now)
        replace_it = node.state in ("idle", "busy")
        self._stop(node)
        if replace_it:
            self._add(True)  # the platform keeps its target: a new spot node is asked for
        self._dispatch()

    def _on_release(self, payload: tuple[Node, int]) -> None:
        node, epoch = payload
        if epoch == node.epoch and node.state == "linger":
            self._gone(node)

    def _on_sample(self, _: Any) -> None:
        v = self.view()
        for key, value in (("t_min", self.now / 60), ("backlog", v.visible + v.busy), ("visible", v.visible),
                           ("nodes", v.alive), ("busy", v.busy)):
            self.series[key].append(value)
        self.policy.sample(self)
        self._at(self.now + SAMPLE_S, "sample", None)

    def _on_eval(self, _: Any) -> None:
        self.apply(self.policy.evaluate(self))
        self._at(self.now + self.policy.interval_s, "eval", None)

    # -- nodes and tasks ----------------------------------------------------------------
    def _set(self, node: Node, state: str) -> None:
        if node.state in ("idle", "linger"):
            self.idle_s += self.now - node.since
        node.state, node.since = state, self.now

    def _gone(self, node: Node) -> None:
        self._set(node, "gone")
        node.gone_at = self.now
        node.epoch += 1

    def _stop(self, node: Node) -> None:
        """The node goes now; a task on it goes back to the queue (work since the checkpoint is lost)."""
        if node.task is not None:
            task = node.task
            self._requeue(task, self.now - task.start)
            self._free(task, but=node)
        self._gone(node)

    def _requeue(self, task: Task, ran: float) -> None:
        ckpt = self.trace.checkpoint_min * 60
        kept = math.floor(ran / ckpt) * ckpt if ckpt > 0 else 0.0
        task.lost += ran - kept
        task.done_work += kept
        task.queued_at = self.now
        self.queue.appendleft(task)

    def _dispatch(self) -> None:
        if self.trace.budget_usd is not None and self.cost() >= self.trace.budget_usd:
            return  # the job is over its budget: upwell stops dispatching it (its nodes fall idle)
        free = [n for n in self.nodes if n.state == "idle" and not n.noticed]
        waiting: deque[Task] = deque()
        while self.queue and free:
            task = self.queue.popleft()
            if task.nodes > len(free):
                waiting.append(task)  # a gang waits for all its nodes; what fits behind it goes on
                continue
            self._start(task, free[:task.nodes])
            free = free[task.nodes:]
        waiting.extend(self.queue)
        self.queue = waiting

    def _start(self, task: Task, held: list[Node]) -> None:
        task.waited += self.now - task.queued_at
        task.start = self.now
        task.held = held
        for node in held:
            self._set(node, "busy")
            node.task = task
            node.run += 1
        head = held[0]  # one "done" event for the attempt, on its first node
        self._at(self.now + max(task.duration - task.done_work, 0.0), "done", (head, head.epoch, head.run))

    def _add(self, spot: bool) -> None:
        reuse = next((n for n in self.nodes if n.spot == spot and n.state == "linger"), None) or next(
            (n for n in self.nodes if n.spot == spot and n.state == "booting" and n.orphan), None)
        if reuse is not None:
            if reuse.state == "linger":
                self._set(reuse, "idle")
                reuse.epoch += 1
                reuse.pod_ready = self.now
            reuse.orphan = False
            return
        k = len(self.nodes)
        node = Node(k, spot, self.now, self.now + self.draws.boot_s(k), since=self.now)
        self.nodes.append(node)
        self._at(node.ready_at, "ready", node)

    def apply(self, plan: Plan) -> None:
        for spot, want in ((True, plan.spot), (False, plan.dedicated)):
            alive = [n for n in self.nodes if n.spot == spot and self._alive(n)]
            for _ in range(max(want - len(alive), 0)):
                self._add(spot)
            if want < len(alive):
                self._shrink(alive, len(alive) - want, plan.mode)
        self._dispatch()

    @staticmethod
    def _alive(n: Node) -> bool:
        return n.state in ("idle", "busy") or (n.state == "booting" and not n.orphan)

    def _shrink(self, alive: list[Node], k: int, mode: str) -> None:
        booting = sorted((n for n in alive if n.state == "booting"), key=lambda n: -n.ready_at)
        idle = [n for n in alive if n.state == "idle"]
        busy = [n for n in alive if n.state == "busy"]
        if mode == "kill":  # ReplicaSet: not-ready first, then the newest ready pods, busy or not
            ready = sorted(idle + busy, key=lambda n: -n.pod_ready)
            for node in (booting + ready)[:k]:
                self._kill_pod(node)
            return
        order = booting + idle + (busy if mode == "taskcompletion" else [])
        for node in order[:k]:
            if node.state == "busy":
                node.state = "draining"  # taskcompletion: leaves when its task is done
            else:
                self._gone(node)

    def _kill_pod(self, node: Node) -> None:
        if node.state == "booting":
            node.orphan = True
            return
        if node.task is not None:
            task = node.task
            self._requeue(task, self.now - task.start)
            self._free(task, but=node)
        self._set(node, "linger")
        node.epoch += 1
        self._at(self.now + self.linger_s, "release", (node, node.epoch))

    # -- what policies see ----------------------------------------------------------------
    def view(self) -> View:
        alive = [n for n in self.nodes if self._alive(n)]
        running = list({id(n.task): n.task for n in self.nodes if n.task is not None}.values())
        return View(visible=len(self.queue), busy=sum(1 for n in self.nodes if n.task is not None),
                    alive=len(alive), booting=sum(1 for n in alive if n.state == "booting"),
                    spot=sum(1 for n in alive if n.spot), running=len(running),
                    gangs=self._gangs(running) if self.has_gangs else ())

    def _gangs(self, running: list[Task]) -> tuple[Gang, ...]:
        """The gangs among the queued and running tasks, as upwell.scale.gangs.backlog gives them."""
        counts: dict[int, list[int]] = {}
        for tasks, i in ((self.queue, 0), (running, 1)):
            for t in tasks:
                if t.nodes > 1:
                    counts.setdefault(t.nodes, [0, 0])[i] += 1
        return tuple(Gang(k, queued=q, running=r) for k, (q, r) in sorted(counts.items()))

    def active_arrivals(self, after: float | None) -> tuple[tuple[float, int], ...]:
        """(arrival time, 1) of the tasks that arrived after ``after`` and are not done: what the autoscaler
        reads from the ledger (each task is a job of one shard; a finished job is no longer active)."""
        while self.arrived < len(self.tasks) and self.tasks[self.arrived].arrival <= self.now:
            self.arrived += 1
        out = []
        for task in reversed(self.tasks[:self.arrived]):
            if after is not None and task.arrival <= after:
                break
            if task.end is None:
                out.append((task.arrival, 1))
        return tuple(reversed(out))

    def preemptions_since(self, t: float) -> int:
        return sum(1 for p in self.preemptions if p >= t)

    def cost(self) -> float:
        return sum(((n.gone_at if n.gone_at is not None else self.now) - n.requested) / 3600
                   * (self.spot_price if n.spot else self.price) for n in self.nodes)

    def mean_boot_s(self) -> float:
        """Mean boot time seen so far; before any boot, the trace's median (what the docs would say)."""
        booted = [n.ready_at - n.requested for n in self.nodes if n.ready_at <= self.now]
        if self.trace.backend == "slurm":
            return 0.0
        return sum(booted) / len(booted) if booted else self.trace.boot_median_min * 60

    def _result(self) -> Result:
        for node in self.nodes:  # close open idle stretches at the end
            if node.state in ("idle", "linger"):
                self._set(node, node.state)
        first = min((t.arrival for t in self.tasks), default=0.0)
        last = max((t.end for t in self.tasks if t.end is not None), default=first)
        waits = sorted(t.waited + (self.now - t.queued_at if t.end is None and t.start is None else 0.0)
                       for t in self.tasks)
        boot = sum(min(n.ready_at, n.gone_at if n.gone_at is not None else self.now) - n.requested
                   for n in self.nodes)
        return Result(self.trace.name, getattr(self.policy, "name", "?"), len(self.tasks), (last - first) / 60,
                      self.cost(), self.idle_s / 60, max(boot, 0.0) / 60, _p95(waits) / 60,
                      sum(t.lost for t in self.tasks) / 60, len(self.preemptions),
                      max(self.series["nodes"], default=0), self.done, self.series)


def _p95(values: list[float]) -> float:
    if not values:
        return 0.0
    k = max(math.ceil(0.95 * len(values)) - 1, 0)
    return sorted(values)[k]
