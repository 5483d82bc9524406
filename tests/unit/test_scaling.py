"""The scaling policy: table-driven cases and hypothesis properties."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from upwell.pools.base import PoolSpec
from upwell.scale.policy import (
    Decision,
    Observation,
    PolicyState,
    commit_hours,
    decide,
    family_label,
    projected_usd,
    split,
    target,
)

SPEC = PoolSpec("cpu", max_nodes=20, max_step=10, scale_down_votes=3, cooldown_s=120, activation_threshold=1)


def obs(visible=0, in_flight=0, nodes=0, **kw) -> Observation:
    return Observation(visible=visible, in_flight=in_flight, nodes=nodes, **kw)


@pytest.mark.parametrize("backlog, per_node, lo, hi, expected", [
    (0, 1, 0, 10, 0),
    (1, 1, 0, 10, 1),
    (7, 4, 0, 10, 2),
    (8, 4, 0, 10, 2),
    (500, 1, 0, 50, 50),
    (0, 1, 2, 10, 2),
    (-3, 1, 0, 10, 0),
    (5, 0, 0, 10, 5),  # tasks_per_node 0 is read as 1
])
def test_target_table(backlog, per_node, lo, hi, expected):
    assert target(backlog, per_node, lo, hi) == expected


@pytest.mark.parametrize("name, spec, observation, state, expect", [
    ("in-flight counts as backlog", SPEC, obs(visible=2, in_flight=6, nodes=8, idle=0), PolicyState(),
     {"target": 8, "removable": 0}),
    ("activation: below the threshold an empty pool stays empty",
     replace(SPEC, activation_threshold=5), obs(visible=4), PolicyState(), {"target": 0, "capped_by": "activation"}),
    ("activation: at the threshold it starts", replace(SPEC, activation_threshold=5), obs(visible=5), PolicyState(),
     {"target": 5}),
    ("activation applies only to 0 -> 1", replace(SPEC, activation_threshold=5), obs(visible=3, nodes=1, idle=1),
     PolicyState(), {"target": 3}),
    ("max step limits growth", SPEC, obs(visible=500, nodes=2), PolicyState(), {"target": 12, "capped_by": "step"}),
    ("max clamps", replace(SPEC, max_step=100), obs(visible=500), PolicyState(), {"target": 20, "capped_by": "max"}),
    ("first lower vote holds", SPEC, obs(visible=1, nodes=5, idle=4), PolicyState(),
     {"target": 5, "removable": 0, "votes": 1}),
    ("third lower vote shrinks idle nodes", SPEC, obs(visible=1, nodes=5, idle=4), PolicyState(low_votes=2),
     {"target": 1, "removable": 4, "votes": 0}),
    ("busy nodes stay when shrinking", SPEC, obs(visible=0, in_flight=1, nodes=5, idle=2), PolicyState(low_votes=2),
     {"target": 3, "removable": 2, "votes": 3}),
    ("to zero only after the cooldown", SPEC, obs(nodes=3, idle=3, now=100.0),
     PolicyState(low_votes=5, idle_since=50.0), {"target": 1, "removable": 2}),
    ("to zero after the cooldown", SPEC, obs(nodes=3, idle=3, now=200.0),
     PolicyState(low_votes=5, idle_since=50.0), {"target": 0, "removable": 3}),
    ("the last node stays a boot time before zero", SPEC, obs(nodes=1, idle=1, now=400.0, boot_s=600),
     PolicyState(low_votes=5, idle_since=0.0), {"target": 1, "removable": 0}),
    ("and goes after it", SPEC, obs(nodes=1, idle=1, now=700.0, boot_s=600),
     PolicyState(low_votes=5, idle_since=0.0), {"target": 0, "removable": 1}),
    ("min nodes kept", replace(SPEC, min_nodes=2), obs(nodes=3, idle=3, now=999.0),
     PolicyState(low_votes=5, idle_since=0.0), {"target": 2, "removable": 1}),
    ("budget caps growth", SPEC, obs(visible=20, price_per_node_hour=6.0, budget_left_usd=3.0, interval_s=600),
     PolicyState(), {"target": 3, "capped_by": "budget"}),
    ("budget shrinks at once, idle only", SPEC,
     obs(visible=0, in_flight=2, nodes=6, idle=4, price_per_node_hour=6.0, budget_left_usd=1.0, interval_s=600),
     PolicyState(), {"target": 2, "removable": 4, "capped_by": "budget"}),
    ("no budget left: nothing starts", replace(SPEC, min_nodes=1), obs(visible=9, price_per_node_hour=1.0,
                                                                       budget_left_usd=0.0), PolicyState(),
     {"target": 0, "capped_by": "budget"}),
    ("free nodes are never budget-capped", SPEC, obs(visible=5, budget_left_usd=0.0), PolicyState(), {"target": 5}),
    # -- prewarm: shards of jobs still being ingested are queued work before their messages are visible
    ("prewarm: announced shards start nodes", SPEC, obs(announced=6, boot_s=360), PolicyState(),
     {"target": 6, "says": "6 being ingested"}),
    ("prewarm: visible messages already counted are not counted twice", SPEC, obs(visible=4, announced=3),
     PolicyState(), {"target": 4, "says": "4 queued"}),
    # -- arrivals are learned into the state: the mean gap within an episode, the time between episodes
    ("learn: the first arrival opens an episode", SPEC, obs(visible=1, now=100.0, boot_s=360, arrivals=((90.0, 1),)),
     PolicyState(), {"target": 1, "last_arrival": 90.0, "episode_start": 90.0, "gap_s": None, "episodes": 1}),
    ("learn: a gap within a boot is a gap per shard", SPEC,
     obs(visible=1, now=200.0, boot_s=360, arrivals=((90.0, 1), (190.0, 2))),
     PolicyState(last_arrival=90.0, episode_start=90.0), {"gap_s": 50.0, "last_arrival": 190.0}),
    ("learn: a pause longer than a boot starts an episode", SPEC,
     obs(visible=1, now=7300.0, boot_s=360, arrivals=((7290.0, 1),)),
     PolicyState(last_arrival=400.0, gap_s=8.0, episode_start=90.0, episodes=1),
     {"episode_start": 7290.0, "episode_gap_s": 7200.0, "gap_s": 8.0, "episodes": 2}),
    ("learn: arrivals already counted are not counted again", SPEC,
     obs(now=300.0, boot_s=360, arrivals=((90.0, 1), (190.0, 2))),
     PolicyState(last_arrival=190.0, gap_s=50.0, episode_start=90.0), {"gap_s": 50.0, "last_arrival": 190.0}),
    # -- release by the expected next arrival against a boot
    ("release: next arrival further off than a boot, idle nodes go at once", SPEC,
     obs(nodes=4, idle=4, now=1000.0, boot_s=360), PolicyState(last_arrival=100.0, gap_s=10.0),
     {"target": 0, "removable": 4, "votes": 0, "says": "longer than a 360 s boot"}),
    ("release: busy nodes stay when the idle ones go at once", SPEC,
     obs(in_flight=2, nodes=5, idle=3, now=1000.0, boot_s=360), PolicyState(last_arrival=100.0, gap_s=10.0),
     {"target": 2, "removable": 3}),
    ("release: next arrival sooner than a boot, the votes decide", SPEC,
     obs(nodes=4, idle=4, now=130.0, boot_s=360), PolicyState(last_arrival=100.0, gap_s=60.0),
     {"target": 4, "removable": 0, "votes": 1, "says": "hold (vote 1/3"}),
    ("release: a quiet spell of three gaps is a pause, counted as the gap", SPEC,
     obs(nodes=2, idle=2, now=500.0, boot_s=360), PolicyState(last_arrival=100.0, gap_s=60.0),
     {"target": 0, "removable": 2, "says": "expected in 400 s"}),
    ("release: nothing learned, the cooldown keeps the last node", SPEC, obs(nodes=1, idle=1, now=400.0, boot_s=600),
     PolicyState(low_votes=5, idle_since=0.0), {"target": 1, "removable": 0}),
    # -- while arrivals keep coming, queued work waits up to three boots for the nodes there
    ("stream: queued work the nodes there start within three boots starts no node", SPEC,
     obs(visible=4, in_flight=2, nodes=2, idle=0, task_s=240, boot_s=360, now=130.0),
     PolicyState(last_arrival=100.0, gap_s=120.0), {"target": 2, "says": "within 3 boots"}),
    ("stream: the same backlog without a stream starts nodes", SPEC,
     obs(visible=4, in_flight=2, nodes=2, idle=0, task_s=240, boot_s=360, now=130.0), PolicyState(),
     {"target": 3, "says": "within a boot"}),
    # -- recurring episodes: fewer, longer-lived nodes that finish the backlog before the next is due
    # 90 of the 120 min, less a boot: 6 twelve-minute tasks per new node, so 7 nodes for 40
    ("episode: 40 twelve-minute tasks, episodes every two hours: 7 nodes, not 20", replace(SPEC, max_step=20),
     obs(visible=40, task_s=720, boot_s=360, now=7300.0),
     PolicyState(last_arrival=7290.0, gap_s=8.0, episode_start=7290.0, episode_gap_s=7200.0, episodes=3),
     {"target": 7, "capped_by": "episode", "says": "episodes come every 120 min"}),
    ("episode: the nodes there (booting ones too) run the backlog: no new node", replace(SPEC, max_step=20),
     obs(visible=40, task_s=720, boot_s=360, nodes=7, idle=7, now=7320.0),
     PolicyState(last_arrival=7310.0, gap_s=8.0, episode_start=7290.0, episode_gap_s=7200.0, episodes=3),
     {"target": 7}),
    ("episode: too late to finish before the next, the plain rule decides", replace(SPEC, max_step=20),
     obs(visible=40, task_s=720, boot_s=360, now=11900.0),
     PolicyState(last_arrival=11890.0, gap_s=8.0, episode_start=7290.0, episode_gap_s=7200.0, episodes=3),
     {"target": 20}),
    ("episode: one gap between two episodes is no pattern yet", replace(SPEC, max_step=20),
     obs(visible=40, task_s=720, boot_s=360, now=7300.0),
     PolicyState(last_arrival=7290.0, gap_s=8.0, episode_start=7290.0, episode_gap_s=7200.0, episodes=2),
     {"target": 20}),
    ("episode: nothing learned, the plain rule decides", replace(SPEC, max_step=20),
     obs(visible=40, task_s=720, boot_s=360, now=100.0), PolicyState(), {"target": 20, "capped_by": "max"}),
    # -- a growing pool never asks a kind below the nodes of it that may be busy
    ("kinds: busy spot nodes are not swapped for dedicated while growing", replace(SPEC, spot_share=0.5),
     obs(visible=4, in_flight=2, nodes=2, idle=0, spot_nodes=2), PolicyState(spot_share=0.0),
     {"target": 6, "spot": 2, "dedicated": 4}),
])
def test_decide_table(name, spec, observation, state, expect):
    d = decide(spec, observation, state)
    assert d.reason
    for key, value in expect.items():
        if key == "says":
            assert value in d.reason, f"{name}: {value!r} not in {d.reason!r}"
            continue
        got = d.state.low_votes if key == "votes" else getattr(d.state if hasattr(d.state, key) else d, key)
        assert got == value, f"{name}: {key} {got} != {value}; {d.reason}"
    assert d.spot + d.dedicated == d.target


def test_quota_shortfall_message():
    gpu = PoolSpec("gpu", max_nodes=8, vm_size="Standard_NC6s_v3")
    d = decide(gpu, obs(visible=4, quota_cores=0, cores_per_node=6, quota_family="standardNCSv3Family"),
               PolicyState())
    assert d.target == 0 and d.capped_by == "quota"
    assert d.message == "pool gpu needs 24 cores of NCSv3 quota; 0 available"
    assert d.message in d.reason


def test_quota_partial_and_quota_nodes():
    gpu = PoolSpec("gpu", max_nodes=8)
    d = decide(gpu, obs(visible=8, nodes=2, quota_cores=12, cores_per_node=6, quota_family="standardNCSv3Family"),
               PolicyState())
    assert d.target == 4 and "needs 36 cores" in d.message and "12 available" in d.message
    d = decide(gpu, obs(visible=8, nodes=2, quota_nodes=1), PolicyState())
    assert d.target == 3 and d.capped_by == "quota"


def test_spot_quota_overflow_goes_dedicated():
    spec = replace(SPEC, spot_share=0.5)
    d = decide(spec, obs(visible=10, spot_quota_nodes=0), PolicyState())
    assert (d.spot, d.dedicated) == (0, 10)
    d = decide(spec, obs(visible=10, spot_quota_nodes=3), PolicyState())
    assert (d.spot, d.dedicated) == (3, 7)


def test_dedicated_quota_overflow_goes_spot_when_allowed():
    spec = replace(SPEC, spot_share=0.5)
    d = decide(spec, obs(visible=10, quota_nodes=2), PolicyState())
    assert (d.spot, d.dedicated) == (8, 2) and d.capped_by == ""


def test_spot_share_rebalances_and_recovers():
    spec = replace(SPEC, spot_share=0.8)
    d = decide(spec, obs(visible=10), PolicyState())
    assert (d.spot, d.dedicated) == (8, 2)
    d = decide(spec, obs(visible=10, nodes=10, spot_nodes=5, preempted_recent=3), d.state)
    assert d.state.spot_share == pytest.approx(0.4) and "preemption rate" in d.reason
    assert d.spot == 5  # every node is busy: a spot node cannot go, so none is swapped (the pool would pass 10)
    d2 = decide(spec, obs(visible=6, in_flight=4, nodes=10, idle=6, spot_nodes=5, preempted_recent=3), d.state)
    assert (d2.spot, d2.dedicated) == (4, 6)  # with idle nodes the split follows the lower share
    assert decide(spec, obs(visible=10, in_flight=5, nodes=10, idle=5, spot_nodes=5, preempted_recent=3),
                  d.state).spot == 5  # never under the spot nodes that may be busy
    d = decide(spec, obs(visible=10, nodes=10, spot_nodes=4, preempted_recent=1), d.state)
    assert d.state.spot_share == pytest.approx(0.4)  # 1/5 = 20% is not above the threshold: hold
    d = decide(spec, obs(visible=10, nodes=10, spot_nodes=4), d.state)
    assert d.state.spot_share == pytest.approx(0.6)
    for _ in range(3):
        d = decide(spec, obs(visible=10, nodes=10, spot_nodes=4), d.state)
    assert d.state.spot_share == pytest.approx(0.8)


def test_helpers():
    assert split(10, 0.25) == (2, 8)  # 2.5 rounds toward dedicated
    assert split(3, 1.0) == (3, 0) and split(0, 0.5) == (0, 0)
    assert family_label("standardNCSv3Family") == "NCSv3" and family_label("") == "vCPU"
    o = obs(price_per_node_hour=2.0, spot_price_per_node_hour=0.5, boot_s=600, interval_s=60, task_s=1200)
    assert commit_hours(o) == pytest.approx(0.5)
    assert projected_usd(o, 2, 1) == pytest.approx((2 * 0.5 + 2.0) * 0.5)


# --- properties -----------------------------------------------------------------

specs = st.builds(
    lambda lo, span, tpn, step, votes, share, act: PoolSpec(
        "p", min_nodes=lo, max_nodes=lo + span, tasks_per_node=tpn, max_step=step, scale_down_votes=votes,
        spot_share=share, activation_threshold=act, cooldown_s=60),
    st.integers(0, 3), st.integers(0, 40), st.integers(1, 8), st.integers(1, 20), st.integers(1, 4),
    st.sampled_from([0.0, 0.25, 0.5, 1.0]), st.integers(1, 5))


@st.composite
def observations(draw, budget=True, quota=True):
    nodes = draw(st.integers(0, 60))
    idle = draw(st.integers(0, nodes))
    spot = draw(st.integers(0, nodes))
    price = draw(st.sampled_from([0.0, 0.1, 2.24, 20.0]))
    return Observation(
        visible=draw(st.integers(0, 2000)), in_flight=draw(st.integers(0, 200)), nodes=nodes, idle=idle,
        spot_nodes=spot, preempted_recent=draw(st.integers(0, 5)), price_per_node_hour=price,
        spot_price_per_node_hour=draw(st.sampled_from([None, price * 0.2])),
        budget_left_usd=draw(st.one_of(st.none(), st.floats(-5, 500))) if budget else None,
        quota_nodes=draw(st.one_of(st.none(), st.integers(0, 30))) if quota else None,
        quota_cores=draw(st.one_of(st.none(), st.integers(0, 200))) if quota else None,
        spot_quota_nodes=draw(st.one_of(st.none(), st.integers(0, 30))) if quota else None,
        cores_per_node=draw(st.sampled_from([0, 2, 6, 32])), boot_s=draw(st.sampled_from([0.0, 180.0, 1800.0])),
        task_s=draw(st.one_of(st.none(), st.floats(1, 7200))), interval_s=draw(st.sampled_from([30.0, 300.0])),
        now=draw(st.floats(0, 1e5)), announced=draw(st.sampled_from([0, 0, 5, 300])),
        arrivals=tuple(draw(st.lists(st.tuples(st.floats(0, 1e5), st.integers(0, 50)), max_size=4))))


maybe_s = st.one_of(st.none(), st.floats(0, 1e5))
maybe_gap = st.one_of(st.none(), st.floats(0.1, 1e4))
states = st.builds(PolicyState, st.integers(0, 5), maybe_s, st.integers(0, 60),
                   st.one_of(st.none(), st.sampled_from([0.0, 0.1, 0.5, 1.0])), maybe_s, maybe_gap, maybe_s, maybe_gap,
                   st.integers(0, 5))


def _check_shape(d: Decision, o: Observation) -> None:
    assert d.spot >= 0 and d.dedicated >= 0 and d.spot + d.dedicated == d.target
    assert d.reason
    busy = o.nodes - o.idle
    assert 0 <= d.removable <= o.idle
    if d.target < o.nodes:
        assert d.removable == o.nodes - d.target and d.target >= busy
    else:
        assert d.removable == 0


@settings(max_examples=300, deadline=None)
@given(specs, observations(), states)
def test_decision_is_well_formed(spec, o, s):
    _check_shape(decide(spec, o, s), o)


@settings(max_examples=300, deadline=None)
@given(specs, observations(budget=False, quota=False), states)
def test_target_within_bounds(spec, o, s):
    d = decide(spec, o, s)
    assert d.target <= max(spec.max_nodes, o.nodes)
    assert d.target >= min(spec.min_nodes, o.nodes + spec.max_step) or o.nodes == 0
    assert d.target <= o.nodes + spec.max_step


@settings(max_examples=300, deadline=None)
@given(specs, observations(), states)
def test_never_exceeds_budget(spec, o, s):
    d = decide(spec, o, s)
    if o.budget_left_usd is None:
        return
    spend = projected_usd(o, d.spot, d.dedicated)
    if d.target > o.nodes:  # nodes are being started: all of it must fit
        assert spend <= o.budget_left_usd + 1e-9
    else:  # only idle nodes can go; anything over budget is busy
        assert spend <= o.budget_left_usd + 1e-9 or d.target == o.nodes - o.idle


@settings(max_examples=300, deadline=None)
@given(specs, observations(), states)
def test_quota_is_respected(spec, o, s):
    d = decide(spec, o, s)
    spot_now = min(o.spot_nodes, o.nodes)
    if o.spot_quota_nodes is not None and d.spot > spot_now:
        assert d.spot <= spot_now + o.spot_quota_nodes
    room = [q for q in (o.quota_nodes, (o.quota_cores // o.cores_per_node) if o.quota_cores is not None
                        and o.cores_per_node else None) if q is not None]
    if room and d.dedicated > o.nodes - spot_now:
        assert d.dedicated <= o.nodes - spot_now + min(room)


@settings(max_examples=300, deadline=None)
@given(specs, observations(), states, st.integers(0, 500))
def test_monotone_in_backlog(spec, o, s, extra):
    lo = decide(spec, o, s)
    hi = decide(spec, replace(o, visible=o.visible + extra), s)
    assert hi.target >= lo.target


@settings(max_examples=200, deadline=None)
@given(specs, observations(budget=False), st.integers(1, 4))
def test_votes_gate_shrinking(spec, o, votes):
    """With fewer than scale_down_votes lower targets in a row, the pool never shrinks."""
    s = PolicyState(low_votes=0)  # nothing learned of the arrivals: the votes rule (see the release rows above)
    d = decide(replace(spec, scale_down_votes=votes + 1), replace(o, arrivals=()), s)
    assert d.target >= o.nodes or d.capped_by == "budget"
