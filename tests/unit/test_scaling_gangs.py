"""The scaling policy counts nodes, not shards (upwell.scale.gangs): table-driven cases."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from upwell.pools.base import PoolSpec
from upwell.scale.gangs import Gang, allocations, as_mapping, backlog
from upwell.scale.policy import Observation, PolicyState, decide

SPEC = PoolSpec("mpi", backend="slurm", max_nodes=20, max_step=20, scale_down_votes=3, cooldown_s=120,
                activation_threshold=1)


def obs(visible=0, in_flight=0, nodes=0, gangs=(), **kw) -> Observation:
    return Observation(visible=visible, in_flight=in_flight, nodes=nodes, gangs=tuple(gangs), **kw)


@pytest.mark.parametrize("name, spec, observation, target, gangs", [
    ("3 two-node shards want 6 nodes", SPEC, obs(3, gangs=[Gang(2, queued=3)]), 6, ((2, 3),)),
    ("the same 3 shards of one node want 3", SPEC, obs(3), 3, ()),
    ("tasks_per_node does not share a gang's nodes", replace(SPEC, tasks_per_node=4),
     obs(3, gangs=[Gang(2, queued=3)]), 6, ((2, 3),)),
    ("mixed: 5 one-node shards at 4 a node and a 3-node gang", replace(SPEC, tasks_per_node=4),
     obs(6, gangs=[Gang(3, queued=1)]), 2 + 3, ((3, 1),)),
    ("running gangs are kept, waiting ones added", SPEC,
     obs(1, in_flight=2, nodes=4, idle=0, gangs=[Gang(2, queued=1, running=2)]), 6, ((2, 3),)),
    ("announced gang shards prewarm", SPEC, obs(0, announced=2, gangs=[Gang(4, announced=2)]), 8, ((4, 2),)),
    ("max_nodes caps: only whole gangs fit", replace(SPEC, max_nodes=5), obs(3, gangs=[Gang(2, queued=3)]), 5,
     ((2, 2),)),
    ("a busy one-node shard keeps its node outside the gangs", replace(SPEC, max_nodes=4),
     obs(2, in_flight=1, nodes=1, idle=0, gangs=[Gang(2, queued=2)]), 4, ((2, 1),)),
])
def test_nodes_not_shards(name, spec, observation, target, gangs):
    d = decide(spec, observation, PolicyState())
    assert (d.target, d.gangs) == (target, gangs), d.reason
    assert sum(k * m for k, m in d.gangs) <= d.target


def test_the_reason_names_the_gangs():
    d = decide(SPEC, obs(3, gangs=[Gang(2, queued=3)]), PolicyState())
    assert "3 waiting + 0 running shards of 2 nodes" in d.reason and "wants 6" in d.reason


@pytest.mark.parametrize("target, gangs, singles, expected", [
    (6, [Gang(2, queued=3)], 0, {2: 3}),
    (5, [Gang(2, queued=3)], 0, {2: 2}),
    (7, [Gang(2, queued=1, running=1), Gang(3, queued=2)], 0, {2: 2, 3: 1}),
    (4, [Gang(2, queued=2)], 1, {2: 1}),
    (0, [Gang(2, queued=2)], 0, {}),
    (3, [Gang(4, running=1)], 0, {}),  # a target below a running gang holds none (the backend keeps busy ones)
])
def test_allocations(target, gangs, singles, expected):
    assert allocations(target, gangs, singles) == expected


def _job(job_id, nodes, total, done=0, failed=0):
    return SimpleNamespace(job_id=job_id, nodes=nodes, shards_total=total, shards_done=done, shards_failed=failed)


def test_backlog_from_job_rows():
    """Waiting = total - done - failed - running, per k; capped by the visible messages, larger gangs first."""
    active = [_job("a", 2, 5, done=1), _job("b", 1, 10), _job("c", 4, 2, failed=1)]
    ingesting = [_job("d", 2, 3)]
    got = backlog(visible=4, active=active, ingesting=ingesting, running_jobs=["a", "a", "b"])
    assert got == (Gang(2, queued=2, announced=3, running=2), Gang(4, queued=1))
    short = backlog(visible=2, active=active, ingesting=(), running_jobs=["a", "a"])
    assert short == (Gang(2, queued=1, running=2), Gang(4, queued=1))
    assert backlog(visible=9, active=[_job("b", 1, 10)], ingesting=(), running_jobs=()) == ()


def test_as_mapping():
    assert as_mapping(()) is None and as_mapping(((2, 0),)) is None
    assert as_mapping(((2, 3), (4, 1))) == {2: 3, 4: 1}


@settings(max_examples=60, deadline=None)
@given(singles=st.integers(0, 40), tpn=st.integers(1, 8),
       gangs=st.dictionaries(st.integers(2, 8), st.integers(1, 6), max_size=3))
def test_an_empty_pool_wants_the_nodes_of_every_shard(singles, tpn, gangs):
    """Uncapped, from empty: ceil(one-node shards / tasks_per_node) + k for each k-node shard, and the
    allocations are every waiting gang."""
    spec = replace(SPEC, tasks_per_node=tpn, max_nodes=1000, max_step=1000)
    g = tuple(Gang(k, queued=m) for k, m in sorted(gangs.items()))
    d = decide(spec, obs(singles + sum(gangs.values()), gangs=g), PolicyState())
    want = -(-singles // tpn) + sum(k * m for k, m in gangs.items())
    assert d.target == want and dict(d.gangs) == gangs
