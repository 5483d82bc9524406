"""The price table, estimates, actuals and budgets: DESIGN.md's worked examples."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from upwell import cost
from upwell.errors import BudgetExceeded, ConfigError

TABLE = cost.load()


def test_table_is_dated_and_sourced():
    assert TABLE.as_of == "2026-11-30"
    assert "Azure Retail Prices API" in TABLE.source
    assert TABLE.currency == "USD"
    assert any("indicative" in note for note in TABLE.notes)


@pytest.mark.parametrize("key, per_hour, vcpus, gpus, family", [
    ("Standard_NC6s_v3", 2.24, 6, 1, "standardNCSv3Family"),
    ("Standard_D32s_v4", 2.5, 32, 0, "standardDSv4Family"),
    ("Standard_D4s_v5", 0.192, 4, 0, "standardDSv5Family"),
    ("Standard_D2s_v5", 0.096, 2, 0, "standardDSv5Family"),
    ("Standard_HB120rs_v3", 3.6, 120, 0, "standardHBrsv3Family"),
    ("Standard_NC24ads_A100_v4", 3.673, 24, 1, "standardNCADSA100v4Family"),
])
def test_vm_rows(key, per_hour, vcpus, gpus, family):
    row = TABLE.get(key)
    assert cost.price(key) == pytest.approx(per_hour)
    assert (row.vcpus, row.gpus, row.quota_family) == (vcpus, gpus, family)
    assert row.spot_quota_family == "lowPriorityCores"


@pytest.mark.parametrize("key", [k for k, p in TABLE.prices.items() if p.kind == "vm"])
def test_spot_is_60_to_90_percent_below_payg(key):
    ratio = cost.price(key, spot=True) / cost.price(key)
    assert 0.1 <= ratio <= 0.4


@pytest.mark.parametrize("nodes, key, hours, spot, usd", [
    (4, "Standard_NC6s_v3", 24, False, 215.04),  # ResNet/ImageNet subset: ~$215
    (1, "Standard_D32s_v4", 48, False, 120.0),  # 48 h GROMACS ~100k atoms: ~$120
    (4, "Standard_NC6s_v3", 24, True, 43.008),  # the same on spot, 80% off
    (10, "local", 100, False, 0.0),
])
def test_worked_examples(nodes, key, hours, spot, usd):
    assert cost.estimate(nodes * hours * 3600, key, spot) == pytest.approx(usd)


def test_gromacs_with_storage_and_egress_is_about_150():
    compute = cost.estimate(48 * 3600, "Standard_D32s_v4")
    total = compute + cost.storage_month(200) + cost.egress(300)
    assert 140 <= total <= 160


def test_storage_egress_and_aci():
    assert cost.storage_month(200) == pytest.approx(4.6)
    assert cost.egress(5) == 0.0
    assert cost.egress(15) == pytest.approx(10 * 0.087)
    # The ACI row is the per-second rates at 4 vCPU / 16 GB.
    assert cost.aci_per_hour(4, 16) == pytest.approx(cost.price("aci-4vcpu-16gb"))
    # No spot offer: charged at PAYG.
    assert cost.price("aci-4vcpu-16gb", spot=True) == cost.price("aci-4vcpu-16gb")


def test_local_is_free_and_has_an_azure_equivalent():
    assert cost.price("local") == 0.0
    eq = TABLE.azure_equivalent("local")
    assert eq is not None and eq.key == "local-equivalent"
    assert eq.payg == TABLE.get("Standard_D4s_v5").payg
    assert TABLE.azure_equivalent("Standard_NC6s_v3").key == "Standard_NC6s_v3"
    assert TABLE.azure_equivalent("nope") is None


def test_unknown_key_names_the_key():
    with pytest.raises(ConfigError, match="Standard_Nope"):
        cost.price("Standard_Nope")


def test_actual_sums_node_seconds_times_price_per_pool_and_spot():
    rows = [
        {"pool": "gpu", "spot": False, "node_seconds": 3600},
        {"pool": "gpu", "spot": "true", "node_seconds": "7200"},  # Table storage may hand back strings
        {"pool": "cpu", "spot": False, "node_seconds": 36000},
        {"pool": "cpu", "node_seconds": None},
        {"pool": "cpu", "price_key": "Standard_D32s_v4", "node_seconds": 3600},
    ]
    keys = {"gpu": "Standard_NC6s_v3", "cpu": "local"}
    usd = cost.actual(rows, pool_keys=keys)
    assert usd == pytest.approx(2.24 + 2 * 0.448 + 0 + 2.5)
    lines = cost.breakdown(rows, pool_keys=keys)
    assert {(ln.key, ln.spot): ln.shards for ln in lines} == {
        ("Standard_NC6s_v3", False): 1, ("Standard_NC6s_v3", True): 1, ("local", False): 1,
        ("Standard_D32s_v4", False): 1}


def test_breakdown_not_strict_keeps_unknown_keys_unpriced():
    lines = cost.breakdown([{"price_key": "mystery", "node_seconds": 10}], strict=False)
    assert lines[0].usd is None and lines[0].node_seconds == 10
    with pytest.raises(ConfigError):
        cost.actual([{"price_key": "mystery", "node_seconds": 10}])


def test_remaining_and_budget_exceeded():
    assert cost.remaining(None, 1e9) == math.inf
    assert cost.remaining(100, 40) == pytest.approx(60)
    assert cost.remaining(100, 100) == 0
    with pytest.raises(BudgetExceeded, match="over"):
        cost.remaining(100, 100.5)


def test_alias_and_bad_rows(tmp_path):
    doc = {"as_of": "2000-01-01", "source": "test", "skus": {
        "a": {"payg": 1.0, "spot": 0.5, "vcpus": 2}, "b": {"alias_of": "a", "note": "same as a"}}}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    table = cost.load(path)
    assert table.get("b").payg == 1.0 and table.get("b").note == "same as a"
    assert cost.price("b", spot=True, prices=table) == 0.5
    with pytest.raises(ConfigError, match="'c'"):
        cost.parse({"skus": {"c": {"alias_of": "zz"}}})
    with pytest.raises(ConfigError, match="'d'"):
        cost.parse({"skus": {"d": {"payg": -1}}})


@given(st.floats(0, 1e7), st.sampled_from(sorted(TABLE.prices)), st.booleans())
def test_estimate_is_linear_and_spot_never_dearer(seconds, key, spot):
    one = cost.estimate(seconds, key, spot)
    assert cost.estimate(2 * seconds, key, spot) == pytest.approx(2 * one)
    assert cost.estimate(seconds, key, True) <= cost.estimate(seconds, key, False) + 1e-9
