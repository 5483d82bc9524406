"""What the command groups share, below all of them: the storage a command reaches, a JOB argument
resolved to a job id, and the table of reconciler actions.

Every command module imports from here and none imports another command module, so the groups stay
independent (``upwell status`` shows the reconciler's actions without importing ``upwell reconcile``).
"""

from __future__ import annotations

import json
import os

import typer
from rich.console import Console
from rich.table import Table

from upwell import names

console = Console()
err = Console(stderr=True)


def open_storage(*, needs_host: bool = False):
    """The Storage the commands use: AzureWebJobsStorage, else the running stack's state file, else the local
    emulator's standard ports (``upwell.local.reach``). Raises StackUnreachable, one line naming what does not
    answer and ``upwell up``, before any SDK call could retry for a minute; a stack that is starting is
    waited for (``UPWELL_CLI_START_WAIT_S``), each try shown. ``needs_host``: also wait until a starting
    stack's functions host is ready (an upload before that gets no event)."""
    from upwell.local import reach
    from upwell.settings import Settings

    target = reach.find()
    reach.check(target, wait_s=Settings.from_env().cli_start_wait_s, needs_host=needs_host,
                say=lambda line: err.print(line, soft_wrap=True, markup=False, highlight=False))
    from upwell.storage import Storage  # the SDK clients load (a second) only once the storage answers
    if target.connection != "identity":
        os.environ[names.CONNECTION] = target.connection  # what the library's own Storage() calls read
    return Storage()


def resolve(storage, text: str) -> str:
    """The job id that ``text`` means; a clear message and exit 1 when there is none."""
    from upwell.lifecycle.find import NoSuchJob, find_job

    try:
        found = find_job(storage, text)
    except NoSuchJob as exc:
        err.print(f"[red]{exc}[/]", soft_wrap=True)
        raise typer.Exit(1) from None
    if found.job_id != text:
        err.print(f"job {found.job_id}" + (f" ({found.note})" if found.note else ""), soft_wrap=True,
                  markup=False)
    return found.job_id


def fold(table: Table) -> Table:
    """The table with every column folding a long cell onto more lines instead of cutting it with an ellipsis
    (rich's default), so an 80-column terminal shows all of it; a column set to ``ignore`` (a whole id) stays."""
    for column in table.columns:
        if column.overflow != "ignore":
            column.overflow = "fold"
    return table


def piped() -> bool:
    """A listing's line as ``soft_wrap``: whole in a pipe or a file (for grep), word-wrapped within a
    terminal's width (nothing past column 80 on an 80-column terminal, nothing cut)."""
    return not console.is_terminal


def print_json(data) -> None:
    """A listing's ``--json``: plain JSON on stdout, never wrapped to the terminal's width."""
    typer.echo(json.dumps(data, indent=1, default=str))


def print_actions(actions: list[dict], title: str) -> None:
    """The reconciler's actions as a table (``upwell reconcile`` and ``upwell status``)."""
    table = Table("at", "kind", "target", "outcome", "detail", title=title)
    for a in actions:  # nothing cut: rich wraps a long cell within the terminal's width
        table.add_row(str(a.get("at") or "")[:19], a.get("kind") or "", a.get("target") or "",
                      a.get("outcome") or "", a.get("detail") or "")
    console.print(fold(table))
