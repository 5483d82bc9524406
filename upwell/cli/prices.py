"""``upwell prices show`` and ``upwell prices refresh``: the dated price table.

Refresh asks the public Azure Retail Prices API (no credentials) for each VM
size in the table, Linux, pay-as-you-go and spot, and rewrites the table with
today's date. Storage and egress rates are kept as they are. Without a network
it fails clearly and leaves the table alone. The parsing is pure and tested;
only ``get_json`` touches the network.
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

import typer

from upwell import cost
from upwell.errors import ConfigError

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
        price = cost.to_float(i.get("retailPrice"))
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
    cost.parse(out)  # never write a table that does not load
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


prices_app = typer.Typer(no_args_is_help=True, help="The dated price table used for estimates, budgets and reports.")


@prices_app.command("show")
def show(file: Path | None = typer.Option(None, "--file", help="a price table file (default: the shipped one)"),
         as_json: bool = typer.Option(False, "--json", help="print the table document as JSON")) -> None:
    """Print the price table: USD per node-hour, pay-as-you-go and spot, with cores, GPUs and quota family."""
    from rich.console import Console
    from rich.table import Table

    path = file or cost.default_path()
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
        table = cost.parse(doc)
    except (OSError, ValueError, ConfigError) as exc:
        typer.echo(f"error: cannot read the price table {path}: {exc}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    out = Table(title=f"Prices as of {table.as_of} ({table.source}), {table.currency} per node-hour")
    for col in ("key", "region", "vCPU", "GiB", "GPU", "PAYG $/h", "spot $/h", "quota family"):
        out.add_column(col, justify="right" if col in ("vCPU", "GiB", "GPU", "PAYG $/h", "spot $/h") else "left")
    for p in table.prices.values():
        gpu = f"{p.gpus}x {p.gpu_model}".strip() if p.gpus else "-"
        out.add_row(p.key + (f" (= {p.alias_of})" if p.alias_of else ""), p.region or "-", str(p.vcpus),
                    f"{p.memory_gib:g}", gpu, f"{p.payg:.4f}", "-" if p.spot is None else f"{p.spot:.4f}",
                    p.quota_family or "-")
    console = Console()
    console.print(out)
    svc = table.services
    console.print(f"Hot blob storage ${svc.blob_hot_gb_month}/GB-month; egress: first {svc.egress_free_gb_month:g} GB"
                  f"/month free, then ${svc.egress_per_gb}/GB; ACI ${svc.aci_vcpu_second:.7f}/vCPU-s, "
                  f"${svc.aci_gb_second:.7f}/GB-s.")
    for note in table.notes:
        console.print(f"[dim]- {note}[/dim]")


@prices_app.command("refresh")
def refresh(region: str | None = typer.Option(None, "--region", help="one region for every SKU, e.g. eastus "
                                              "(default: each SKU's own region)"),
            out: Path | None = typer.Option(None, "--out", help="where to write (default: the shipped table)"),
            timeout: float = typer.Option(20.0, "--timeout", help="seconds per request")) -> None:
    """Refresh VM prices from the public Azure Retail Prices API (needs a network)."""
    src = cost.default_path()
    dest = out or src
    doc = json.loads(src.read_text(encoding="utf-8"))
    try:
        new, lines = refreshed(doc, lambda url: get_json(url, timeout), region)
    except RefreshFailed as exc:
        typer.echo(f"error: {exc}. Refreshing needs a network; the price table dated {doc.get('as_of')} "
                   "is unchanged.", err=True)
        raise typer.Exit(1) from None
    try:
        write_atomic(dest, new)
    except OSError as exc:
        typer.echo(f"error: cannot write {dest}: {exc}. Pass --out PATH.", err=True)
        raise typer.Exit(1) from None
    for line in lines:
        typer.echo(line)
    typer.echo(f"wrote {dest} (as of {new['as_of']})")


def register(app: typer.Typer) -> None:
    app.add_typer(prices_app, name="prices")
