"""``upwell quarantine list | show PATH | retry PATH``: rejected uploads, their errors, and a re-ingest.

Reads the ``.error.json`` files beside the kept copies in the ``quarantine`` container
(``upwell.ingest.quarantine``). PATH is the name under ``quarantine/`` (with or without that prefix), as
``list`` prints it.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from upwell.cli.shared import err, fold, open_storage, piped, print_json

quarantine_app = typer.Typer(no_args_is_help=True, help="Rejected uploads: list them, read their errors, retry.")
console = Console()


def _fail(exc: Exception) -> None:
    err.print(f"[red]{exc}[/]", soft_wrap=True, highlight=False)
    raise typer.Exit(1)


@quarantine_app.command("list")
def list_(as_json: bool = typer.Option(False, "--json", help="one JSON list")) -> None:
    """Every quarantined upload: its name, when, the first error and how many bad rows."""
    storage = open_storage()
    from upwell.ingest.quarantine import listing

    found = listing(storage)
    if as_json:
        print_json(found)
        return
    if not found:
        console.print("nothing in quarantine")
        return
    table = Table("path", "rejected", "rows", "why", title=f"quarantine: {len(found)} upload(s)")
    for e in found:
        rows = f"{len(e.get('rows') or [])}{'+' if e.get('more_rows') else ''}"
        table.add_row(e["path"], str(e.get("rejected_at") or "")[:19], rows, str(e.get("message") or ""))
    console.print(fold(table))


@quarantine_app.command("show")
def show(path: str = typer.Argument(..., help="the name under quarantine/, as `upwell quarantine list` prints it"),
         as_json: bool = typer.Option(False, "--json", help="the error file as it is")) -> None:
    """One quarantined upload's error: what failed, and every bad row found (up to UPWELL_QUARANTINE_MAX_ROWS)."""
    storage = open_storage()
    from upwell.errors import NotFound, UpwellError
    from upwell.ingest.quarantine import error_of

    try:
        error = error_of(storage, path)
    except NotFound:
        _fail(f"no error file for {path} in quarantine/ (`upwell quarantine list` names them)")
    except UpwellError as exc:
        _fail(exc)
    if as_json:
        print_json(error)
        return
    console.print(f"{path}: {error.get('message')}", soft_wrap=piped(), markup=False, highlight=False)
    console.print(f"  job {error.get('job_id')}, rejected {error.get('rejected_at')}; field {error.get('field')!r}"
                  f"{'; limit ' + str(error['limit']) if error.get('limit') else ''}", soft_wrap=piped(), markup=False)
    rows = error.get("rows") or []
    if rows:
        table = Table("row", "field", "problem", title=f"{len(rows)} bad row(s)"
                      f"{', and maybe more (the list stops at the limit)' if error.get('more_rows') else ''}")
        for r in rows:
            table.add_row(str(r.get("row")), str(r.get("field")), str(r.get("message")))
        console.print(fold(table))


@quarantine_app.command("retry")
def retry(path: str = typer.Argument(..., help="the name under quarantine/"),
          file: Path = typer.Option(None, "--file", exists=True, dir_okay=False,
                                    help="a fixed file to upload instead of the kept copy")) -> None:
    """Ingest a quarantined upload again (after fixing its rule, or with --file after fixing the file): it is
    uploaded to its incoming/ name as a new upload, a new job; the quarantined copy is removed once it is."""
    storage = open_storage(needs_host=True)
    from upwell.errors import NotFound, UpwellError
    from upwell.ingest.blobnames import job_id_for
    from upwell.ingest.quarantine import retry as do_retry

    try:
        name, etag = do_retry(storage, path, file.read_bytes() if file else None)
    except NotFound:
        _fail(f"nothing quarantined as {path} (`upwell quarantine list` names them)")
    except UpwellError as exc:
        _fail(exc)
    console.print(f"uploaded incoming/{name} again (job {job_id_for(name, etag)}); `upwell status "
                  f"{name}` follows it", soft_wrap=True, markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    app.add_typer(quarantine_app, name="quarantine")
