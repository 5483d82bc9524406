"""``upwell prices show`` and ``upwell prices refresh``: the dated price table, presented.

The table and its refresh are ``upwell.cost.prices`` and ``upwell.cost.refresh``; refresh
rewrites the table with today's date, and without a network it fails clearly and leaves
the table alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from upwell import cost
from upwell.cost import refresh as pricing
from upwell.errors import ConfigError

prices_app = typer.Typer(no_args_is_help=True, help="The dated price table used for estimates, budgets and reports.")


@prices_app.command("show")
def show(file: Path | None = typer.Option(None, "--file", help="a price table file (default: the shipped one)"),
         as_json: bool = typer.Option(False, "--json", help="print the table document as JSON")) -> None:
    """Print the price table: USD per node-hour, pay-as-you-go and spot, with cores, GPUs and quota family."""
    from rich.console import Console
    from rich.table import Table

    from upwell.cli.shared import fold

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
    console.print(fold(out))
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
        new, lines = pricing.refreshed(doc, lambda url: pricing.get_json(url, timeout), region)
    except pricing.RefreshFailed as exc:
        typer.echo(f"error: {exc}. Refreshing needs a network; the price table dated {doc.get('as_of')} "
                   "is unchanged.", err=True)
        raise typer.Exit(1) from None
    try:
        pricing.write_atomic(dest, new)
    except OSError as exc:
        typer.echo(f"error: cannot write {dest}: {exc}. Pass --out PATH.", err=True)
        raise typer.Exit(1) from None
    for line in lines:
        typer.echo(line)
    typer.echo(f"wrote {dest} (as of {new['as_of']})")


def register(app: typer.Typer) -> None:
    app.add_typer(prices_app, name="prices")
