"""``upwell janitor``: find leaked, idle, expired and overdue resources; act on them with --apply."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table


def janitor(apply: bool = typer.Option(False, "--apply", help="act as the policy says (default: a dry run)"),
            policy: Path = typer.Option(None, "--policy", help="policy file (YAML): actions per kind, idle_minutes, "
                                        "include_untagged"),
            include_untagged: bool = typer.Option(False, "--include-untagged",
                                                  help="also act on resources without upwell's tags"),
            as_json: bool = typer.Option(False, "--json")) -> None:
    """Scan the resource group and Batch account in UPWELL_SUBSCRIPTION_ID, UPWELL_RESOURCE_GROUP and
    UPWELL_BATCH_ACCOUNT_URL (and the ledger, for jobs past their max wall-clock). Every finding is recorded."""
    from dataclasses import replace

    from upwell.cli.shared import fold, open_storage, print_json
    from upwell.ops import janitor as J

    console = Console()
    pol = J.Policy.load(policy)
    if include_untagged:
        pol = replace(pol, include_untagged=True)
    findings = J.run(open_storage(), apply=apply, policy=pol)
    if as_json:
        print_json([f.as_row() for f in findings])
        return
    table = Table("kind", "resource", "tagged", "why", "action", "result" if apply else "would",
                  title=f"janitor {'(applied)' if apply else '(dry run: nothing changed; --apply acts)'}")
    for f in findings:
        table.add_row(f.kind, f.name, "yes" if f.tagged else "[yellow]no[/]", f.reason, f.action,
                      f.result if apply else ("skip (untagged)" if not f.tagged and not pol.include_untagged
                                              else f.action))
    console.print(fold(table) if findings else "janitor: nothing found")


def register(app: typer.Typer) -> None:
    app.command()(janitor)
