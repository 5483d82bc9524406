"""VMSS and ACI run one node per shard: a ``gangs`` request reaching their scale_to is a PoolError, raised
before any request is built (ingest refuses such shards there: upwell.shape.GangUnsupported)."""

from __future__ import annotations

import pytest

from upwell.errors import PoolError
from upwell.pools.aci import AciPool
from upwell.pools.base import PoolSpec
from upwell.pools.vmss import VmssPool


class NoClient:
    """An SDK client that fails the test on first use: no request may be built for a gang."""

    def __getattr__(self, name):
        raise AssertionError(f"the pool reached its client ({name}) with a gang request")


@pytest.mark.parametrize("cls, backend", [(VmssPool, "vmss"), (AciPool, "aci")])
def test_gangs_with_entries_are_refused(cls, backend):
    pool = cls(PoolSpec("cpu", backend=backend, max_nodes=8), client=NoClient())
    with pytest.raises(PoolError, match=r"pool 'cpu' \(" + backend + r"\) runs one node per shard.*3 of 2 nodes"):
        pool.scale_to(6, gangs={2: 3})


@pytest.mark.parametrize("cls, backend", [(VmssPool, "vmss"), (AciPool, "aci")])
@pytest.mark.parametrize("gangs", [None, {}, {2: 0}])
def test_no_gangs_goes_on_to_the_client(cls, backend, gangs):
    """Without an allocation the request goes on (here to the client, which the stand-in refuses)."""
    pool = cls(PoolSpec("cpu", backend=backend, max_nodes=8), client=NoClient())
    with pytest.raises(AssertionError, match="reached its client"):
        pool.scale_to(1, gangs=gangs)
