"""`upwell simulate` with gangs: a trace's tasks of k nodes start on k nodes at once, and upwell's policy sees
them as the Autoscaler does (upwell.scale.gangs), so the simulation agrees with the policy."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from upwell.errors import ConfigError
from upwell.scale.baselines import make_policy, pool_spec
from upwell.scale.comparison import run
from upwell.scale.gangs import backlog
from upwell.scale.poolsim import Draws, Sim
from upwell.scale.traces import Trace, expand


def trace(*groups, **kw) -> Trace:
    base = Trace(name="g", description="", arrivals=tuple(groups), max_nodes=6, price_per_node_hour=1.0,
                 spot_price_per_node_hour=0.2, boot_median_min=3, boot_sigma=0.0, boot_min_min=3, boot_max_min=3)
    return replace(base, **kw)


GANGS = {"at_min": 0, "count": 3, "duration_min": 10, "nodes": 2}


@pytest.mark.parametrize("backend", ["slurm", "cloud"])
def test_three_two_node_tasks_get_six_nodes_at_once(backend):
    r = run(trace(GANGS), "upwell", 0, backend=backend)
    assert r.completed == 3 and r.peak_nodes == 6
    boot = 0.0 if backend == "slurm" else 3.0
    assert r.makespan_min == pytest.approx(boot + 10.0, abs=0.6)


def test_a_capped_pool_runs_whole_gangs_only():
    """Five nodes hold two gangs of two; the third starts when one finishes."""
    r = run(trace(GANGS, max_nodes=5), "upwell", 0, backend="slurm")
    assert r.completed == 3 and r.peak_nodes <= 5
    assert r.makespan_min == pytest.approx(20.0, abs=0.6)


def test_one_node_tasks_fill_in_behind_a_waiting_gang():
    t = trace({"at_min": 0, "count": 1, "duration_min": 10, "nodes": 4},
              {"at_min": 0, "count": 4, "duration_min": 5}, max_nodes=4)
    r = run(t, "upwell", 0, backend="slurm")
    assert r.completed == 5 and r.peak_nodes == 4


def test_an_evicted_gang_node_requeues_the_task_and_frees_the_rest():
    """Spot nodes evicted often: every gang task still completes, and no node ends holding a task."""
    t = trace({"at_min": 0, "count": 6, "duration_min": 30, "nodes": 3}, spot_share=1.0, max_nodes=6,
              evictions_per_spot_node_hour=1.0)
    spec = pool_spec("g", max_nodes=6, spot_share=1.0)
    sim = Sim(t, make_policy("upwell", spec, 0), expand(t, 0), Draws(t, 0))
    r = sim.run(48 * 3600)
    assert r.completed == 6 and r.evictions > 0 and r.lost_task_min > 0
    assert all(n.task is None for n in sim.nodes)


def test_the_policy_sees_the_gangs_the_autoscaler_would():
    """At the first arrival: the simulation's view of 3 two-node and 2 one-node tasks queued is what
    upwell.scale.gangs.backlog makes of the same jobs' rows, and the first target is 3 x 2 + 2 nodes."""
    t = trace(GANGS, {"at_min": 0, "count": 2, "duration_min": 10}, max_nodes=10)
    policy = make_policy("upwell", pool_spec("g", max_nodes=10, max_step=10), 0)
    sim = Sim(t, policy, expand(t, 0), Draws(t, 0))
    sim.arrived = 0
    for task in sim.tasks:
        sim.queue.append(task)
    rows = [SimpleNamespace(job_id="a", nodes=2, shards_total=3, shards_done=0, shards_failed=0),
            SimpleNamespace(job_id="b", nodes=1, shards_total=2, shards_done=0, shards_failed=0)]
    assert sim.view().gangs == backlog(5, rows, (), ())
    assert policy.evaluate(sim).total == 8


def test_a_gang_larger_than_the_pool_is_refused():
    with pytest.raises(ConfigError, match="nodes must be 1 to max_nodes"):
        expand(trace({**GANGS, "nodes": 7}), 0)
