"""``upwell settings``: every UPWELL_* setting, its default, who reads it, what it does, and its value here.

The reference is ``upwell.settingsdoc``; ``--write-docs`` regenerates docs/operate.md's table from it.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from upwell import REPO
from upwell.cli.shared import fold, print_json


def settings(as_json: bool = typer.Option(False, "--json", help="one JSON list"),
             write_docs: bool = typer.Option(False, "--write-docs",
                                             help="regenerate the reference table in docs/operate.md"),
             docs: Path = typer.Option(REPO / "docs" / "operate.md", help="with --write-docs: the page")) -> None:
    """List every UPWELL_* setting: its default, who reads it (app, agent, local), what it does, and the value
    set in this environment."""
    from upwell import settingsdoc

    if write_docs:
        changed = settingsdoc.write_docs(docs)
        typer.echo(f"{docs}: {'settings table rewritten' if changed else 'settings table already current'}")
        return
    ref = settingsdoc.reference()
    if as_json:
        print_json([{**d.__dict__, "set": os.environ.get(d.var)} for d in ref])
        return
    table = Table("setting", "default", "by", "what", "set here", title=f"{len(ref)} settings")
    for d in ref:
        table.add_row(d.var, d.default, d.where, d.what, os.environ.get(d.var, ""))
    Console().print(fold(table))


def register(app: typer.Typer) -> None:
    app.command()(settings)
