"""Tags on everything upwell creates: the request builders carry them, and the janitor reads them."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime

from upwell.cost import tags
from upwell.pools import build_aci, build_batch, build_vmss
from upwell.pools.base import PoolSpec

OPTS = {"image": "lab.azurecr.io/upwell-worker:2", "subscription_id": "s", "resource_group": "rg",
        "account_name": "ba", "location": "eastus", "subnet_id": "/sub/net", "ssh_public_key": "ssh-ed25519 AAAA",
        "tags": {"project": "ocean", "owner": "lead@lab.org"}, "ttl_days": 10}
REQUIRED = {tags.PROJECT, tags.OWNER, tags.EXPIRES}


def spec(backend: str) -> PoolSpec:
    return PoolSpec("cpu", backend=backend, vm_size="Standard_D4s_v5", options=dict(OPTS))


def test_pool_tags_name_project_owner_pool_and_expiry():
    t = tags.pool_tags("cpu", "vmss", OPTS, now=datetime(2026, 1, 1, tzinfo=UTC))
    assert t[tags.PROJECT] == "ocean" and t[tags.OWNER] == "lead@lab.org" and t[tags.POOL] == "cpu"
    assert t[tags.EXPIRES] == "2026-01-11"
    assert tags.pool_tags("gpu", "aci", {}, now=datetime(2026, 1, 1, tzinfo=UTC))[tags.EXPIRES] == "2026-01-31"


def test_every_builder_tags_its_resource():
    vmss = build_vmss.as_json(build_vmss.scale_set(spec("vmss"), spot=False))
    aci = json.loads(json.dumps(build_aci.container_group(spec("aci"), "upwell-cpu-0a1b2c3d").serialize()))
    batch = build_batch.pool_body(spec("batch"))["properties"]
    for t in (vmss["tags"], aci["tags"], batch["resourceTags"], tags.from_metadata(batch["metadata"])):
        assert set(t) >= REQUIRED and t[tags.POOL] == "cpu" and t[tags.PROJECT] == "ocean", t


def test_is_upwell_and_expired():
    assert tags.is_upwell({tags.POOL: "cpu"}) and not tags.is_upwell({"project": "x"}) and not tags.is_upwell(None)
    assert tags.expired({tags.EXPIRES: "2026-01-01"}, today=date(2026, 1, 2))
    assert not tags.expired({tags.EXPIRES: "2026-01-02"}, today=date(2026, 1, 2))
    assert not tags.expired({tags.EXPIRES: "soon"}) and not tags.expired({})
