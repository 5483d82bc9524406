"""``upwell prices refresh`` against a local server playing the Azure Retail Prices API: the real command,
its real HTTP client, and answers in the API's documented JSON shape (``Items``, ``NextPageLink``, each item
with ``armSkuName``, ``retailPrice``, ``unitOfMeasure``, ``productName``, ``skuName``, ``meterName``,
``type``, ``effectiveStartDate`` ...). The assertions read the table the command wrote: what it computed
from what was served."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from urllib.parse import urlencode

import pytest
import typer
from typer.testing import CliRunner

from upwell import cost
from upwell.cli import prices as cli
from upwell.cost import refresh

PATH = "/api/retail/prices"
SHIPPED = json.loads(cost.default_path().read_text())
VMS = {k: r for k, r in SHIPPED["skus"].items() if r.get("kind", "vm") == "vm" and not r.get("alias_of")}
UNANSWERED = "Standard_HB120rs_v3"  # the API knows nothing of it: the old price stays
# Linux pay-as-you-go, and spot where served (the first SKU's spot is on a second page).
PAYG = {sku: round(0.5 + i * 0.25, 4) for i, sku in enumerate(sorted(VMS)) if sku != UNANSWERED}
SPOT = {sku: round(p / 7, 4) for i, (sku, p) in enumerate(sorted(PAYG.items())) if i % 2 == 0}
FIRST = min(SPOT)


def _item(sku: str, price: float, *, sku_name: str, product: str = "Virtual Machines Series",
          unit: str = "1 Hour", start: str = "2026-12-01T00:00:00Z") -> dict:
    """One item as the API documents it."""
    return {"currencyCode": "USD", "tierMinimumUnits": 0.0, "retailPrice": price, "unitPrice": price,
            "armRegionName": VMS[sku]["region"], "location": "US East", "effectiveStartDate": start,
            "meterId": f"m-{sku}-{sku_name}", "meterName": sku_name, "productId": "DZH318Z0BQ4B",
            "skuId": "DZH318Z0BQ4B/00TG", "productName": product, "skuName": sku_name,
            "serviceName": "Virtual Machines", "serviceId": "DZH313Z7MMC8", "serviceFamily": "Compute",
            "unitOfMeasure": unit, "type": "Consumption", "isPrimaryMeterRegion": True, "armSkuName": sku}


def _items(sku: str) -> list[dict]:
    """What the API holds for a SKU: the Linux price, and the decoys the refresh must pass over."""
    if sku not in PAYG:
        return []
    name = sku.removeprefix("Standard_").replace("_", " ")
    found = [_item(sku, PAYG[sku], sku_name=name),
             _item(sku, PAYG[sku] * 0.9, sku_name=name, start="2025-01-01T00:00:00Z"),  # superseded
             _item(sku, PAYG[sku] * 2, sku_name=name, product="Virtual Machines Series Windows"),
             _item(sku, PAYG[sku] / 10, sku_name=f"{name} Low Priority"),
             _item(sku, PAYG[sku] * 700, sku_name=name, unit="1/Month")]
    if sku in SPOT and sku != FIRST:
        found.append(_item(sku, SPOT[sku], sku_name=f"{name} Spot"))
    return found


def _page(base: str):
    """The API's answer to one request: a query's first page, or the second page of FIRST."""

    def answer(rec, _match):
        if rec.q("page") == "2":
            name = FIRST.removeprefix("Standard_").replace("_", " ")
            return 200, {"BillingCurrency": "USD", "CustomerEntityId": "Default", "CustomerEntityType": "Retail",
                         "Items": [_item(FIRST, SPOT[FIRST], sku_name=f"{name} Spot")], "NextPageLink": None,
                         "Count": 1}
        sku = rec.q("$filter").split("armSkuName eq '")[1].split("'")[0]
        more = f"{base}{PATH}?{urlencode({'page': 2, 'sku': sku})}" if sku == FIRST else None
        found = _items(sku)
        return 200, {"BillingCurrency": "USD", "CustomerEntityId": "Default", "CustomerEntityType": "Retail",
                     "Items": found, "NextPageLink": more, "Count": len(found)}

    return answer


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("noop")(lambda: None)
    cli.register(app)
    return app


def test_contract_refresh_writes_the_prices_the_api_served(server, tmp_path, monkeypatch):
    server.route("GET", PATH, _page(server.url))
    monkeypatch.setattr(refresh, "API", server.url + PATH)
    out = tmp_path / "prices.json"
    res = CliRunner().invoke(_app(), ["prices", "refresh", "--out", str(out)])
    assert res.exit_code == 0, res.output

    table = cost.parse(json.loads(out.read_text()))
    today = datetime.now(UTC).date().isoformat()
    assert table.as_of == today and f"fetched {today}" in table.source
    for sku, payg in PAYG.items():
        row, old = table.get(sku), VMS[sku]
        assert row.payg == payg, sku  # the newest Linux pay-as-you-go item, not Windows, Low Priority or monthly
        # a served spot price, else the old spot discount applied to the new price
        want = SPOT.get(sku, round(payg * old["spot"] / old["payg"], 4))
        assert row.spot == pytest.approx(want), sku
        assert row.region == old["region"]
    assert table.get(UNANSWERED).payg == VMS[UNANSWERED]["payg"]  # kept, and the command says so
    assert f"{UNANSWERED} ({VMS[UNANSWERED]['region']}): no Linux pay-as-you-go price found" in res.output
    assert table.get("local").payg == 0 and table.services == cost.parse(SHIPPED).services

    asked = {r.q("$filter") for r in server.calls("GET", PATH) if r.q("page") is None}
    assert asked == {f"serviceName eq 'Virtual Machines' and armRegionName eq '{r['region']}' "
                     f"and armSkuName eq '{sku}' and priceType eq 'Consumption'" for sku, r in VMS.items()}
    assert [r.q("sku") for r in server.calls("GET", PATH) if r.q("page") == "2"] == [FIRST]  # the next page


def test_contract_refresh_of_an_api_that_knows_nothing_writes_nothing(server, tmp_path, monkeypatch):
    server.route("GET", PATH, (200, {"BillingCurrency": "USD", "Items": [], "NextPageLink": None, "Count": 0}))
    monkeypatch.setattr(refresh, "API", server.url + PATH)
    out = tmp_path / "prices.json"
    res = CliRunner().invoke(_app(), ["prices", "refresh", "--out", str(out)])
    assert res.exit_code == 1 and not out.exists()
    assert f"{SHIPPED['as_of']} is unchanged" in res.output
    assert len(server.calls("GET", PATH)) == len(VMS)  # every SKU was asked for
