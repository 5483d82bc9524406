"""``upwell reconcile``: one reconciler pass now (missed, dead-lettered and poisoned events)."""

from __future__ import annotations

import typer

from upwell.cli.shared import open_storage, print_actions, print_json


def reconcile(dry_run: bool = typer.Option(False, "--dry-run", help="find and show, change nothing"),
              grace_s: int = typer.Option(None, help="seconds an upload may wait for its event "
                                                     "(default: UPWELL_RECONCILE_GRACE_S, 120)"),
              as_json: bool = typer.Option(False, "--json", help="the pass and its actions as JSON")) -> None:
    """Find uploads, results and reports that no event started, and dead-lettered or poisoned events;
    re-drive them through ingest and collect (idempotent). Every action is logged and shown by `upwell status`."""
    import dataclasses

    from upwell.ops.reconcile import Reconciler
    from upwell.settings import Settings

    settings = Settings.from_env()
    if grace_s is not None:
        settings = dataclasses.replace(settings, reconcile_grace_s=grace_s)
    result = Reconciler(open_storage(), settings, dry_run=dry_run).run()
    if as_json:
        print_json({"dry_run": dry_run, "listed": result.listed, "events": result.events,
                               "checked": result.checked, "seconds": result.seconds,
                               "actions": [a.__dict__ for a in result.actions]})
        return
    print_actions([a.__dict__ for a in result.actions], f"reconcile{' (dry run)' if dry_run else ''}: "
                  f"{result.listed} listed, {result.events} feed records, {result.checked} checked, "
                  f"{len(result.actions)} actions, "
                  f"{result.seconds:.2f} s")


def register(app: typer.Typer) -> None:
    app.command()(reconcile)
