"""The clairvoyant lower bound in upwell simulate, and the policy's drain rule."""

from __future__ import annotations

from dataclasses import replace

import pytest

from upwell.pools.base import PoolSpec
from upwell.scale.clairvoyant import lower_bound
from upwell.scale.comparison import compare
from upwell.scale.policy import Observation, PolicyState, decide, drain
from upwell.scale.traces import DEFAULT_TRACES, load_trace


@pytest.mark.parametrize("name", DEFAULT_TRACES)
def test_no_policy_beats_the_bound(name):
    trace = load_trace(name)
    bound = lower_bound(trace, 0)
    assert bound.cost_usd > 0 and bound.makespan_min > 0
    for result in compare([trace], 0)[trace.name]:
        assert result.cost_usd >= bound.cost_usd - 1e-9, result.policy
        assert result.makespan_min >= bound.makespan_min - 1e-9, result.policy
        assert result.cost_x_makespan >= bound.cost_x_makespan, result.policy


def test_bound_on_a_slurm_cluster_waits_for_no_boot():
    trace = load_trace("burst")
    assert lower_bound(trace, 0, "slurm").makespan_min < lower_bound(trace, 0).makespan_min


SPEC = PoolSpec("cpu", max_nodes=10, scale_down_votes=1)
BUSY = Observation(visible=1, in_flight=2, nodes=2, idle=0, task_s=240.0, boot_s=360.0, now=100.0)


def test_queued_work_the_nodes_there_will_start_within_a_boot_asks_for_no_node():
    assert drain(SPEC, BUSY) == 3  # 2 slots x 360 s / 240 s
    assert decide(SPEC, BUSY, PolicyState()).target == 2
    # more queued than they can start in a boot time: new nodes for the rest
    assert decide(SPEC, replace(BUSY, visible=7), PolicyState()).target == 6


def test_the_drain_never_removes_a_node_the_backlog_keeps():
    idle_ones = replace(BUSY, visible=3, nodes=5, idle=3)  # 5 nodes, 2 busy, 3 queued: all 5 have work
    assert decide(SPEC, idle_ones, PolicyState(low_votes=5)).target == 5


def test_without_a_task_time_the_policy_is_the_backlog_formula():
    unknown = replace(BUSY, task_s=None)
    assert drain(SPEC, unknown) == 0 and decide(SPEC, unknown, PolicyState()).target == 3
