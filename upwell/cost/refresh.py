"""Refresh the dated price table from the public Azure Retail Prices API (no credentials).

For each VM size in the table it asks for Linux, pay-as-you-go and spot prices, and returns
a new table document with today's date. Storage and egress rates are kept as they are. The
parsing is pure and tested; only ``get_json`` touches the network, and any failure there is a
``RefreshFailed`` that leaves the table alone.
"""

from __future__ import annotations

import json
import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from upwell.cost.accounting import to_float
from upwell.cost.prices import parse

API = "https://prices.azure.com/api/retail/prices"
API_VERSION = "2023-01-01-preview"
MAX_PAGES = 20
GetJson = Callable[[str], dict]


class RefreshFailed(Exception):
    """The price API could not be reached or answered nonsense; the table is unchanged."""


def vm_url(sku: str, region: str) -> str:
    flt = (f"serviceName eq 'Virtual Machines' and armRegionName eq '{region}' "
           f"and armSkuName eq '{sku}' and priceType eq 'Consumption'")
    return f"{API}?{urllib.parse.urlencode({'api-version': API_VERSION, '$filter': flt})}"


def items(url: str, get_json: GetJson) -> list[dict]:
    """Every item of a query, following NextPageLink."""
    out: list[dict] = []
    for _ in range(MAX_PAGES):
        page = get_json(url)
        if not isinstance(page, dict):
            raise RefreshFailed(f"unexpected answer from {API}: {type(page).__name__}")
        out.extend(i for i in page.get("Items") or () if isinstance(i, dict))
        url = page.get("NextPageLink") or ""
        if not url:
            break
    return out


def pick_vm(found: list[dict]) -> tuple[float | None, float | None]:
    """(PAYG, spot) USD per hour for Linux from a VM query's items; None where absent."""
    payg: list[tuple[str, float]] = []
    spot: list[tuple[str, float]] = []
    for i in found:
        name = f"{i.get('skuName', '')} {i.get('meterName', '')}"
        if "windows" in str(i.get("productName", "")).lower() or "low priority" in name.lower():
            continue
        if str(i.get("unitOfMeasure", "1 Hour")) != "1 Hour" or str(i.get("type", "Consumption")) != "Consumption":
            continue
        price = to_float(i.get("retailPrice"))
        if price is None or price <= 0:
            continue
        (spot if "spot" in name.lower() else payg).append((str(i.get("effectiveStartDate", "")), price))
    return _newest(payg), _newest(spot)


def _newest(prices: list[tuple[str, float]]) -> float | None:
    return max(prices)[1] if prices else None


def refreshed(doc: dict, get_json: GetJson, region: str | None = None,
              today: str | None = None) -> tuple[dict, list[str]]:
    """A new table document with fresh VM prices; and one line per SKU saying what changed."""
    out = json.loads(json.dumps(doc))
    lines, regions = [], set()
    for key, row in out.get("skus", {}).items():
        if row.get("kind", "vm") != "vm" or row.get("alias_of"):
            continue
        where = region or row.get("region") or "eastus"
        payg, spot = pick_vm(items(vm_url(key, where), get_json))
        if payg is None:
            lines.append(f"{key} ({where}): no Linux pay-as-you-go price found; kept ${row.get('payg')}/h")
            continue
        old_payg, old_spot = row.get("payg"), row.get("spot")
        if spot is None and old_spot is not None and old_payg:
            spot = round(payg * float(old_spot) / float(old_payg), 4)  # keep the old discount: indicative
        row.update(payg=payg, spot=spot, region=where)
        regions.add(where)
        lines.append(f"{key} ({where}): ${old_payg}/h -> ${payg}/h, spot ${old_spot}/h -> ${spot}/h")
    if not regions:
        raise RefreshFailed("the price API returned no VM prices; the table is unchanged")
    day = today or datetime.now(UTC).date().isoformat()
    out["as_of"] = day
    out["source"] = f"Azure Retail Prices API ({', '.join(sorted(regions))}), fetched {day}"
    notes = [n for n in out.get("notes", []) if not n.startswith("Refreshed ")]
    out["notes"] = notes + [f"Refreshed {day}: VM prices from the API; storage, egress and ACI rates kept."]
    parse(out)  # never write a table that does not load
    return out, lines


def get_json(url: str, timeout: float = 20.0) -> dict:
    """GET a JSON document; any network or decode failure is a RefreshFailed."""
    request = urllib.request.Request(url, headers={"Accept": "application/json", "User-Agent": "upwell"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:  # a fixed https URL
            return json.loads(resp.read().decode("utf-8"))
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise RefreshFailed(f"cannot reach {API} ({reason})") from None
    except ValueError as exc:
        raise RefreshFailed(f"{API} answered with something that is not JSON ({exc})") from None


def write_atomic(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".prices-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
