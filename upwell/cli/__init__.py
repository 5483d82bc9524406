"""The ``upwell`` command line. Each command group lives in its own module."""

from __future__ import annotations

import sys

import typer

# add_completion: typer's --install-completion and --show-completion (bash, zsh, fish, PowerShell).
app = typer.Typer(add_completion=True, no_args_is_help=True,
                  help="upwell: event-driven research computing on Azure, and on this machine.")


def _version(value: bool) -> None:
    if value:
        from upwell import __version__

        typer.echo(f"upwell {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="print the version and exit")) -> None:
    """upwell: event-driven research computing on Azure, and on this machine."""

# Each module registers its commands on `app` through register(app).
_MODULES = ("upwell.cli.pipeline", "upwell.cli.jobs", "upwell.cli.payload", "upwell.cli.simulate", "upwell.cli.prices",
            "upwell.cli.cost", "upwell.cli.ops", "upwell.cli.reconcile", "upwell.cli.access", "upwell.cli.logs",
            "upwell.cli.quarantine", "upwell.cli.settings")


def _register() -> None:
    import importlib

    for name in _MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(app)


_register()


def main() -> None:
    """The ``upwell`` console script: an upwell error (the stack not running, a bad setting) is one line on
    stderr and exit 1, never a traceback; anything else is a bug and keeps its traceback."""
    from upwell.errors import UpwellError

    try:
        app()
    except UpwellError as exc:
        sys.stderr.write(f"upwell: {exc}\n")
        sys.exit(1)
