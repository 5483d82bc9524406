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
    """The published worked example, from the table's own rates: 48 h compute, 200 GB hot for a month,
    300 GB of egress past the free allowance."""
    svc = cost.load().services
    storage = 200 * svc.blob_hot_gb_month
    egress = (300 - svc.egress_free_gb_month) * svc.egress_per_gb
    total = cost.estimate(48 * 3600, "Standard_D32s_v4") + storage + egress
    assert storage == pytest.approx(4.6) and svc.egress_free_gb_month == 5
    assert 140 <= total <= 160


def test_aci_has_no_spot_offer():
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


# --- upwell prices refresh: the API answer is parsed without a network ---------------------------

def _item(sku: str, price: float, *, product="Virtual Machines NCSv3 Series", sku_name="NC6s v3",
          start="2026-01-01T00:00:00Z", unit="1 Hour") -> dict:
    return {"armSkuName": sku, "retailPrice": price, "unitOfMeasure": unit, "productName": product,
            "skuName": sku_name, "meterName": sku_name, "type": "Consumption", "effectiveStartDate": start}


def _fake_api(answers: dict[str, list[dict]], seen: list[str]):
    from urllib.parse import parse_qs, urlparse

    def get_json(url: str) -> dict:
        seen.append(url)
        if "page=2" in url:
            return {"Items": [_item("Standard_NC6s_v3", 0.61, sku_name="NC6s v3 Spot")], "NextPageLink": None}
        flt = parse_qs(urlparse(url).query)["$filter"][0]
        sku = flt.split("armSkuName eq '")[1].split("'")[0]
        more = "https://prices.azure.com/api/retail/prices?page=2" if sku == "Standard_NC6s_v3" else None
        return {"Items": answers.get(sku, []), "NextPageLink": more}

    return get_json


def test_refresh_parses_linux_payg_and_spot_and_follows_pages():
    from upwell.cost import refresh

    answers = {"Standard_NC6s_v3": [
        _item("Standard_NC6s_v3", 3.06),
        _item("Standard_NC6s_v3", 2.90, start="2025-01-01T00:00:00Z"),  # older: superseded
        _item("Standard_NC6s_v3", 5.20, product="Virtual Machines NCSv3 Series Windows"),
        _item("Standard_NC6s_v3", 0.30, sku_name="NC6s v3 Low Priority"),
        _item("Standard_NC6s_v3", 0.01, unit="1/Month"),
    ], "Standard_D32s_v4": [_item("Standard_D32s_v4", 1.536, sku_name="D32s v4")]}
    seen: list[str] = []
    doc = json.loads(cost.default_path().read_text())
    new, lines = refresh.refreshed(doc, _fake_api(answers, seen), today="2027-01-02")
    table = cost.parse(new)
    assert table.as_of == "2027-01-02" and "Azure Retail Prices API" in table.source
    assert table.get("Standard_NC6s_v3").payg == 3.06 and table.get("Standard_NC6s_v3").spot == 0.61
    d32 = table.get("Standard_D32s_v4")
    assert d32.payg == 1.536 and d32.spot == pytest.approx(1.536 * 0.2)  # no spot answer: old discount
    assert table.get("Standard_D4s_v5").payg == 0.192  # no answer at all: kept, and said so
    assert any("Standard_D4s_v5" in ln and "kept" in ln for ln in lines)
    assert table.get("local-equivalent").payg == 0.192 and table.get("local").payg == 0
    assert table.services.blob_hot_gb_month == 0.023
    assert all(u.startswith("https://prices.azure.com/api/retail/prices?") for u in seen)
    assert "armRegionName+eq+%27eastus2%27" in next(u for u in seen if "D32s_v4" in u)
    assert doc["as_of"] == "2026-11-30"  # the input document is not modified


def test_refresh_without_network_fails_clearly_and_writes_nothing(tmp_path, monkeypatch):
    import socket

    import typer
    from typer.testing import CliRunner

    from upwell.cli import prices as cli
    from upwell.cost import refresh

    with socket.socket() as s:  # a port nothing listens on: the real client meets a refused connection
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}/api/retail/prices"
    monkeypatch.setattr(refresh, "API", closed)
    app = typer.Typer()
    app.command("noop")(lambda: None)
    cli.register(app)
    out = tmp_path / "prices.json"
    res = CliRunner().invoke(app, ["prices", "refresh", "--out", str(out)])
    assert res.exit_code == 1 and not out.exists()
    assert f"cannot reach {closed}" in res.output and "2026-11-30 is unchanged" in res.output
    res = CliRunner().invoke(app, ["prices", "show"])
    assert res.exit_code == 0 and "Standard_NC6s_v3" in res.output and "2026-11-30" in res.output


def test_refresh_with_an_api_that_knows_nothing_fails():
    from upwell.cost import refresh

    with pytest.raises(refresh.RefreshFailed):
        refresh.refreshed(json.loads(cost.default_path().read_text()), lambda url: {"Items": []})
