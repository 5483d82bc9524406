"""``upwell cost``: what jobs cost, per job, owner or project, beside their estimates and budgets."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table


def cost(by: str = typer.Option("job", "--by", help="job, owner or project"),
         since: str = typer.Option("30d", "--since", help="jobs created since: 30d, 12h, 2w or an ISO date"),
         as_json: bool = typer.Option(False, "--json")) -> None:
    """Cost summed from each shard's node-seconds x price x share of the node, with the estimate's error."""
    from upwell.cli.shared import fold, print_json
    from upwell.cli.shared import open_storage as _storage
    from upwell.cost.accounting import parse_since, rollup
    from upwell.ledger import Ledger
    from upwell.settings import Settings

    console = Console()
    try:
        floor = parse_since(since)
        groups = rollup(Ledger(_storage()), by, floor, budgets=Settings.from_env().budgets)
    except ValueError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    rows = [g.as_dict() for g in groups]
    total = {"actual_usd": sum(r["actual_usd"] for r in rows), "estimate_usd": sum(r["estimate_usd"] for r in rows),
             "shards": sum(r["shards"] for r in rows), "node_seconds": sum(r["node_seconds"] for r in rows)}
    if as_json:
        print_json({"by": by, "since": floor.isoformat(), "groups": rows, "total": total})
        return
    table = Table(by, "jobs", "shards", "node-hours", "actual $", "estimate $", "error", "budget $", "left $",
                  title=f"cost by {by} since {floor:%Y-%m-%d %H:%M} UTC")
    for r in rows:
        err = "" if r["error_pct"] is None else f"{r['error_pct']:+.0f}%"
        table.add_row(r["key"], str(r["jobs"]), str(r["shards"]), f"{r['node_seconds'] / 3600:.3f}",
                      f"{r['actual_usd']:.4f}", f"{r['estimate_usd']:.4f}", err,
                      "" if r["budget_usd"] is None else f"{r['budget_usd']:.2f}",
                      "" if r["budget_left_usd"] is None else f"{r['budget_left_usd']:.2f}")
    table.add_row("total", str(sum(r["jobs"] for r in rows)), str(total["shards"]),
                  f"{total['node_seconds'] / 3600:.3f}", f"{total['actual_usd']:.4f}", f"{total['estimate_usd']:.4f}",
                  "", "", "", style="bold")
    console.print(fold(table))


def register(app: typer.Typer) -> None:
    app.command()(cost)
