"""The shape of a task (upwell.shape): nodes x ranks, held against the pool at submit and the node at dispatch."""

from __future__ import annotations

import pytest

from upwell import shape
from upwell.errors import InputRejected
from upwell.messages import WorkItem
from upwell.settings import PoolSpec
from workers import launch


def pool(backend="slurm", max_nodes=4, **options) -> PoolSpec:
    return PoolSpec("mpi", backend=backend, max_nodes=max_nodes, options=options)


@pytest.mark.parametrize(("asked", "nodes", "ranks", "per_node"), [
    ({}, 1, 1, 1),
    ({"nodes": 2, "ranks_per_node": 3}, 2, 6, 3),
    ({"nodes": 2, "ranks": 5}, 2, 5, 3),  # spread: 3 + 2
    ({"nodes": 3, "ranks": 1}, 3, 3, 1),  # at least one rank on every node
    ({"nodes": 2, "ranks": 4, "ranks_per_node": 2}, 2, 4, 2),  # both, and they agree
])
def test_resolve_spreads_ranks_over_nodes(asked, nodes, ranks, per_node):
    s = shape.resolve(**asked)
    assert (s.nodes, s.ranks, s.ranks_per_node) == (nodes, ranks, per_node)


def test_ranks_that_disagree_with_ranks_per_node_name_both():
    with pytest.raises(InputRejected, match=r"nodes x ranks_per_node \(2 x 2 = 4\)") as err:
        shape.resolve(nodes=2, ranks=6, ranks_per_node=2)
    assert err.value.field == "resources.ranks"


def test_more_nodes_than_the_pool_has_is_refused_by_name():
    with pytest.raises(shape.TooManyNodes) as err:
        shape.check_pool(shape.Shape(3, 3), pool(max_nodes=2, cores_per_node=8))
    assert err.value.to_dict()["error"] == "TooManyNodes" and err.value.limit == "max_nodes=2"
    shape.check_pool(shape.Shape(2, 2), pool(max_nodes=2, cores_per_node=8))  # at the limit: fine
    shape.check_pool(shape.Shape(1, 1), pool(max_nodes=0, cores_per_node=8))  # a paused pool's work waits


@pytest.mark.parametrize("backend", ["vmss", "aci", "local"])
def test_backends_without_gangs_refuse_several_nodes_and_say_which_can(backend):
    with pytest.raises(shape.GangUnsupported, match="slurm, batch"):
        shape.check_pool(shape.Shape(2, 2), pool(backend=backend, max_nodes=8, cores_per_node=8))
    shape.check_pool(shape.Shape(1, 2), pool(backend=backend, max_nodes=8, cores_per_node=8))


def test_a_batch_pool_runs_several_nodes_only_with_gangs():
    with pytest.raises(shape.GangUnsupported, match="options.gangs"):
        shape.check_pool(shape.Shape(2, 2), pool(backend="batch", max_nodes=8, cores_per_node=8))
    shape.check_pool(shape.Shape(2, 2), pool(backend="batch", max_nodes=8, cores_per_node=8, gangs=True))


def test_oversubscription_is_refused_unless_asked_for():
    spec = pool(cores_per_node=4)
    with pytest.raises(shape.Oversubscribed, match="5 ranks per node but a node of pool 'mpi' has 4 cores"):
        shape.check_pool(shape.Shape(2, 10), spec)
    shape.check_pool(shape.Shape(2, 10, oversubscribe=True), spec)
    shape.check_pool(shape.Shape(2, 8), spec)


def test_pool_cores_come_from_the_vm_size_or_this_machine():
    hb = PoolSpec("mpi", backend="batch", vm_size="Standard_D32s_v4", price_key="Standard_D32s_v4")
    assert shape.pool_cores(hb) == 32
    assert shape.pool_cores(PoolSpec("mpi", backend="local")) == (launch.os.cpu_count() or 1)
    assert shape.pool_cores(PoolSpec("mpi", backend="slurm", vm_size="unknown")) is None  # nothing says: no check


def test_the_agent_refuses_an_oversubscribed_item_before_starting_anything(tmp_path):
    cores = launch.node_cores()
    item = WorkItem(job_id="j", shard_id="s", payload="heat-mpi", pool="mpi", ranks=cores + 1)
    with pytest.raises(shape.Oversubscribed, match=f"{cores + 1} ranks per node but this node has {cores}"):
        launch.run_payload(item, tmp_path / "w")
    assert not (tmp_path / "w").exists()
