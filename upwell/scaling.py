"""The scaling policy: pure functions, no I/O.

``decide`` works out a pool's target from what was observed; the Autoscaler
(upwell.autoscale) does the I/O. The state it carries between evaluations is
``PolicyState``; every Decision has a human-readable ``reason``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from upwell.pools.base import PoolSpec


@dataclass(frozen=True)
class Observation:
    visible: int  # visible messages on work-<pool>
    in_flight: int  # shards the ledger shows running on this pool
    nodes: int  # alive nodes: pending + idle + running
    idle: int = 0
    preempted_recent: int = 0  # preemptions seen in the recent window
    spent_usd: float = 0.0
    budget_left_usd: float | None = None  # None: no budget
    quota_nodes: int | None = None  # nodes the quota still allows beyond `nodes`; None: unknown
    price_per_node_hour: float = 0.0
    now: float = 0.0

    @property
    def backlog(self) -> int:
        return self.visible + self.in_flight


@dataclass(frozen=True)
class PolicyState:
    low_votes: int = 0
    idle_since: float | None = None
    last_target: int = 0


@dataclass(frozen=True)
class Decision:
    target: int
    reason: str
    state: PolicyState
    spot: int = 0
    dedicated: int = 0
    capped_by: str = ""  # "", "budget", "quota", "max"
    message: str = ""  # shown on job status, e.g. a quota shortfall


def target(backlog: int, tasks_per_node: int, min_nodes: int, max_nodes: int) -> int:
    """ceil(backlog / tasks_per_node), clamped to [min_nodes, max_nodes]."""
    want = math.ceil(max(backlog, 0) / max(tasks_per_node, 1))
    return max(min_nodes, min(max_nodes, want))


def decide(spec: PoolSpec, obs: Observation, state: PolicyState) -> Decision:
    want = target(obs.backlog, spec.tasks_per_node, spec.min_nodes, spec.max_nodes)
    if obs.nodes == 0 and obs.backlog < spec.activation_threshold:
        want = spec.min_nodes
    reason = f"backlog {obs.backlog} ({obs.visible} queued + {obs.in_flight} running) / {spec.tasks_per_node} per node"
    if want < obs.nodes:
        votes = state.low_votes + 1
        if votes < spec.scale_down_votes:
            return Decision(obs.nodes, f"{reason}; hold at {obs.nodes} (vote {votes}/{spec.scale_down_votes} to shrink)",
                            replace(state, low_votes=votes, last_target=obs.nodes), dedicated=obs.nodes)
        return Decision(want, f"{reason}; shrink to {want}", PolicyState(last_target=want), dedicated=want)
    return Decision(want, f"{reason}; target {want}", PolicyState(last_target=want), dedicated=want)
