"""The shape of a task: how many nodes a shard takes and how many MPI ranks run on each.

A definition (``resources``) and a manifest (``resources``) may ask for ``nodes`` and
``ranks_per_node``, or for ``ranks`` spread over ``nodes`` (the last node may get fewer).
``Shape`` is the resolved answer that travels on the work item; ``check_pool`` holds it
against the pool at submit and ``check_node`` against the node at dispatch, each raising a
named error (``InputRejected`` subclasses, so the quarantine's ``.error.json`` names it):

- ``TooManyNodes``: more nodes than the pool's ``max_nodes`` (it would wait for ever);
- ``GangUnsupported``: ``nodes > 1`` on a backend that has no gangs (only Slurm and Batch do);
- ``Oversubscribed``: more ranks on a node than it has cores, unless ``oversubscribe`` is said.

Pure: the pool's cores come from its options (``cores_per_node``), its VM size's vCPUs in the
price table, or, for the local backend, this machine's; the node's from what the caller passes.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from upwell.errors import InputRejected

# The backends that can start one allocation of several nodes for one shard.
GANG_BACKENDS = ("slurm", "batch")
MAX_NODES = 64


class TooManyNodes(InputRejected):
    """A shard asks for more nodes than its pool can ever have."""


class GangUnsupported(InputRejected):
    """A shard asks for several nodes on a pool whose backend runs one node per shard."""


class Oversubscribed(InputRejected):
    """More ranks on one node than it has cores, and the definition did not allow it."""


@dataclass(frozen=True)
class Shape:
    nodes: int = 1
    ranks: int = 1  # in all, over every node
    oversubscribe: bool = False

    @property
    def ranks_per_node(self) -> int:
        """The most ranks any one node runs (the first nodes, where ranks do not divide evenly)."""
        return math.ceil(max(1, self.ranks) / max(1, self.nodes))


def resolve(*, nodes: int | None = None, ranks: int | None = None, ranks_per_node: int | None = None,
            oversubscribe: bool = False, field: str = "resources") -> Shape:
    """The shape from what was asked: ``ranks_per_node`` x ``nodes``, or ``ranks`` spread over ``nodes``."""
    n = int(nodes or 1)
    if n < 1 or n > MAX_NODES:
        raise InputRejected(f"nodes must be between 1 and {MAX_NODES}, got {n}", field=f"{field}.nodes")
    if ranks_per_node is not None:
        total = int(ranks_per_node) * n
        if ranks not in (None, 1, total):
            raise InputRejected(f"ranks ({ranks}) is not nodes x ranks_per_node ({n} x {ranks_per_node} = {total}); "
                                "give one or the other", field=f"{field}.ranks")
        return Shape(n, total, bool(oversubscribe))
    total = int(ranks or 1)
    if total < n:
        total = n  # at least one rank on every node it holds
    return Shape(n, total, bool(oversubscribe))


def pool_cores(spec) -> int | None:
    """Cores of one node of ``spec`` (a PoolSpec): ``options.cores_per_node``, else the VM size's vCPUs,
    else this machine's for the local backend; None where nothing says."""
    explicit = (spec.options or {}).get("cores_per_node")
    if explicit:
        return int(explicit)
    from upwell.cost import prices

    table = prices.load()
    if spec.backend == "local":
        return os.cpu_count() or 1
    for key in (spec.vm_size, spec.price_key):
        row = table.prices.get(key) if key != "local" else None
        if row is not None and row.vcpus:
            return int(row.vcpus)
    return None


def check_pool(shape: Shape, spec, field: str = "resources") -> None:
    """At submit: the pool can run this shape, or a named error says why not and what can."""
    if shape.nodes > 1 and spec.backend not in GANG_BACKENDS:
        raise GangUnsupported(
            f"pool {spec.name!r} ({spec.backend}) runs one node per shard; a shard of {shape.nodes} nodes needs "
            f"a pool whose backend is one of {', '.join(GANG_BACKENDS)}", field=f"{field}.nodes")
    if shape.nodes > 1 and spec.backend == "batch" and not (spec.options or {}).get("gangs"):
        # Its nodes' one-node agents would defer the shard for ever (upwell.pools.build_batch.is_gang_pool).
        raise GangUnsupported(
            f"Batch pool {spec.name!r} has no gangs; a shard of {shape.nodes} nodes needs a Batch pool with "
            f"options.gangs (multi-instance tasks) or a slurm pool", field=f"{field}.nodes")
    # One node on a pool of max_nodes 0 is a paused pool's work, which waits; a gang needs k nodes at once.
    if shape.nodes > 1 and shape.nodes > spec.max_nodes:
        raise TooManyNodes(f"the shard asks for {shape.nodes} nodes; pool {spec.name!r} has at most "
                           f"{spec.max_nodes} (max_nodes), so it would never start", field=f"{field}.nodes",
                           limit=f"max_nodes={spec.max_nodes}")
    check_cores(shape, pool_cores(spec), where=f"a node of pool {spec.name!r}", field=field)


def check_cores(shape: Shape, cores: int | None, *, where: str, field: str = "resources") -> None:
    """More ranks per node than ``cores`` is refused unless the shape says ``oversubscribe``."""
    if cores and shape.ranks_per_node > cores and not shape.oversubscribe:
        raise Oversubscribed(
            f"{shape.ranks_per_node} ranks per node but {where} has {cores} cores; ask for more nodes or fewer "
            "ranks, or say `oversubscribe: true` in the definition's or the manifest's resources",
            field=f"{field}.ranks_per_node", limit=f"cores={cores}")


def of_item(item) -> Shape:
    """The shape a work item carries."""
    return Shape(max(1, int(item.nodes or 1)), max(1, int(item.ranks or 1)), bool(item.oversubscribe))
