"""Scaling policies run side by side on workload traces: one policy on one trace (``run``), every policy
on every trace (``compare``).

Each run expands the trace with the seed and draws node boots and evictions with the same seed
(upwell.scale.poolsim.Draws), so every policy meets the same tasks and the same nodes.
"""

from __future__ import annotations

from dataclasses import replace

from upwell.errors import ConfigError
from upwell.scale.baselines import DEFAULT_POLICIES, make_policy, pool_spec
from upwell.scale.poolsim import LINGER_S, Draws, Sim
from upwell.scale.sim_results import Result
from upwell.scale.traces import Trace, expand

BACKENDS = ("cloud", "slurm")


def run(trace: Trace, policy: str, seed: int = 0, *, max_nodes: int | None = None,
        spot_share: float | None = None, linger_s: float = LINGER_S, backend: str | None = None) -> Result:
    """One policy on one trace. ``linger_s``: how long a Kubernetes node stays after its pod went;
    ``backend``: "slurm" models a fixed cluster of ``max_nodes`` whose agents start at once."""
    if backend is not None:
        trace = replace(trace, backend=backend)
    if trace.backend not in BACKENDS:
        raise ConfigError(f"trace {trace.name}: backend must be one of {list(BACKENDS)}, got {trace.backend!r}")
    spec = pool_spec(trace.name, max_nodes=max_nodes or trace.max_nodes, tasks_per_node=trace.tasks_per_node,
                     spot_share=trace.spot_share if spot_share is None else spot_share, price_key=trace.price_key)
    if spot_share is not None:
        trace = replace(trace, spot_share=spot_share)
    tasks = expand(trace, seed)
    sim = Sim(trace, make_policy(policy, spec, seed, trace.budget_usd), tasks, Draws(trace, seed), linger_s)
    horizon = max((a for a, _, _ in tasks), default=0.0) + sum(d for _, d, _ in tasks) + 48 * 3600
    return sim.run(horizon)


def compare(traces: list[Trace], seed: int = 0, policies: tuple[str, ...] = DEFAULT_POLICIES, *,
            max_nodes: int | None = None, spot_share: float | None = None,
            linger_s: float = LINGER_S, backend: str | None = None) -> dict[str, list[Result]]:
    """Every policy on every trace: {trace name: [Result per policy]}."""
    return {t.name: [run(t, p, seed, max_nodes=max_nodes, spot_share=spot_share, linger_s=linger_s,
                         backend=backend) for p in policies] for t in traces}
