"""Whether a pool can run a shard's shape, as `upwell submit` and ingest both say it (upwell.ingest.poolfit)."""

from __future__ import annotations

import pytest

from upwell import shape
from upwell.ingest import poolfit
from upwell.settings import PoolSpec

VMSS = PoolSpec("cpu", backend="vmss", max_nodes=8, options={"cores_per_node": 4})
ACI = PoolSpec("aci", backend="aci", max_nodes=8, options={"cores_per_node": 4})
SLURM = PoolSpec("hpc", backend="slurm", max_nodes=2, options={"cores_per_node": 4})
BATCH = PoolSpec("big", backend="batch", max_nodes=16, options={"cores_per_node": 120, "gangs": True})


def pools(*specs):
    return {s.name: s for s in specs}


@pytest.mark.parametrize("configured, asked, says", [
    (pools(VMSS, ACI, SLURM, BATCH), shape.Shape(2, 2), "pools that can run it: big, hpc (set `pool:`"),
    (pools(VMSS, ACI, SLURM, BATCH), shape.Shape(4, 4), "pools that can run it: big (set"),
    (pools(VMSS, SLURM), shape.Shape(3, 3), "no configured pool can run it: the slurm/batch pools (hpc) refuse it"),
    (pools(VMSS, SLURM), shape.Shape(2, 16), "no configured pool can run it"),  # 8 ranks a node > 4 cores
    (pools(VMSS, ACI), shape.Shape(2, 2), "no slurm or batch pool is configured (UPWELL_POOLS)"),
])
def test_gang_unsupported_names_the_pools_that_can(configured, asked, says):
    with pytest.raises(shape.GangUnsupported) as err:
        poolfit.check(asked, configured, "cpu")
    assert "pool 'cpu' (vmss) runs one node per shard" in err.value.message and says in err.value.message
    assert err.value.to_dict()["error"] == "GangUnsupported" and err.value.field == "resources.nodes"


def test_other_errors_pass_through_or_name_the_upload():
    with pytest.raises(shape.TooManyNodes) as err:
        poolfit.check(shape.Shape(3, 3), pools(SLURM), "hpc")
    assert err.value.message.startswith("the shard asks for 3 nodes") and err.value.limit == "max_nodes=2"
    with pytest.raises(shape.Oversubscribed, match=r"^incoming/x/job.yaml: 6 ranks per node") as err:
        poolfit.check(shape.Shape(1, 6), pools(VMSS), "cpu", where="incoming/x/job.yaml")
    assert err.value.limit == "cores=4"
    poolfit.check(shape.Shape(1, 6, oversubscribe=True), pools(VMSS), "cpu")  # asked for: no error
    poolfit.check(shape.Shape(2, 8), pools(SLURM), "hpc")
