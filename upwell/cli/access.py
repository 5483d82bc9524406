"""``upwell access``: who may upload, see and register what, one project at a time (issue 27).

``upwell access grant PRINCIPAL --project P --role submitter|viewer|operator`` makes one role
assignment on the storage account whose ABAC condition keeps it to project P
(``upwell.access.conditions``); ``upwell access list`` shows upwell's assignments; ``upwell access
revoke PRINCIPAL --project P [--role R]`` removes them. On Azure (``UPWELL_ACCESS_SCOPE``, the storage
account's resource id) they are Azure role assignments; locally, the file ``UPWELL_ACCESS_FILE``.
"""

from __future__ import annotations

import typer
from rich.table import Table

from upwell.cli.shared import console, err

access_app = typer.Typer(no_args_is_help=True, help="Grant, list and revoke project roles (ABAC conditions).")


def register(app: typer.Typer) -> None:
    app.add_typer(access_app, name="access")


def _store():
    from upwell.access.caller import open_store
    from upwell.settings import Settings

    return open_store(Settings.from_env())


def _fail(exc: Exception) -> None:
    err.print(f"{type(exc).__name__}: {exc}", markup=False, soft_wrap=True)
    raise typer.Exit(2) from None


@access_app.command("grant")
def grant(principal: str = typer.Argument(..., help="Entra object id of a user, group, guest or app"),
          project: str = typer.Option(..., "--project", help="the project (incoming/<project>/)"),
          role: str = typer.Option(..., "--role", help="submitter, viewer or operator"),
          principal_type: str = typer.Option("User", "--type", help="User, Group or ServicePrincipal")) -> None:
    """Give PRINCIPAL a role in one project (idempotent: a second grant changes nothing)."""
    from upwell.access.roles import Grant
    from upwell.access.roles import role as parse_role
    from upwell.errors import UpwellError

    try:
        g = Grant(principal, project, parse_role(role), principal_type)
        created = _store().grant(g)
    except UpwellError as exc:
        _fail(exc)
    console.print(f"{'granted' if created else 'already granted'}: {g.role.value} in {g.project} to {principal}",
                  markup=False)


@access_app.command("list")
def list_grants(project: str = typer.Option("", "--project", help="only this project"),
                principal: str = typer.Option("", "--principal", help="only this principal"),
                as_json: bool = typer.Option(False, "--json", help="one JSON list")) -> None:
    """upwell's role assignments: principal, project, role, assignment name."""
    from upwell.cli.shared import fold, print_json
    from upwell.errors import UpwellError

    try:
        rows = [(a, a.grant) for a in _store().list(principal=principal or None)]
    except UpwellError as exc:
        _fail(exc)
    rows = [(a, g) for a, g in rows if g is not None and (not project or g.project == project)]
    if as_json:
        print_json([{"principal": a.principal, "project": g.project, "role": g.role.value, "assignment": a.name,
                     "principal_type": g.principal_type} for a, g in rows])
        return
    table = Table("principal", "project", "role", "assignment", title="upwell access")
    for a, g in rows:
        table.add_row(a.principal, g.project, g.role.value, a.name)
    console.print(fold(table))


@access_app.command("revoke")
def revoke(principal: str = typer.Argument(...), project: str = typer.Option(..., "--project"),
           role: str = typer.Option("", "--role", help="only this role (default: every role in the project)")) -> None:
    """Remove PRINCIPAL's upwell roles in one project."""
    from upwell.access.roles import role as parse_role
    from upwell.errors import UpwellError

    try:
        wanted = parse_role(role) if role else None
        store = _store()
        gone = [a for a in store.list(principal=principal) if a.grant and a.grant.project == project
                and (wanted is None or a.grant.role is wanted)]
        for a in gone:
            store.revoke(a)
    except UpwellError as exc:
        _fail(exc)
    console.print(f"revoked {len(gone)} assignment(s) of {principal} in {project}", markup=False)
