"""``upwell payload``: manage payload definitions, and run one on this machine as a worker agent would.

``upwell payload validate FILE`` prints every problem with its path in the file (and, as warnings,
what is valid but likely a mistake: a param that a ``${name}`` of the tool's own would swallow);
``upwell payload push FILE`` validates and registers a definition in the ``payloads``
container (operators only: the container's write role; version ``dev`` may be pushed over);
``upwell payload delete NAME@VERSION`` removes a pushed version (refused, ``PayloadInUse``, while an
open job runs it); ``upwell payload list`` shows built-in and registered definitions with their versions.

``upwell payload run FILE.yaml --param k=v`` runs a definition file that is not pushed yet, once, under
the agent's contract (the same launcher and work dir); nothing is pushed.

``upwell payload run heat-mpi --ranks 2 --param nx=128`` validates the parameters
against the registry's model, calls ``workers.launch.run_payload`` in a fresh work
directory, copies ``out/`` and ``ckpt/`` (and ``payload.log``) to ``--out``, and
prints the result as JSON. Ctrl-C or SIGTERM asks the payload to checkpoint and
stop; ``--resume DIR`` continues from such a checkpoint. The exit status is 0
(succeeded), 75 (preempted), 1 (failed) or 2 (bad parameters).
"""

from __future__ import annotations

import json
import shutil
import signal
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer

from upwell import names
from upwell.errors import InputRejected, TransientError, UpwellError
from upwell.messages import WorkItem
from upwell.payloads.builtin import EXIT_PREEMPTED

payload_app = typer.Typer(no_args_is_help=True, help="Run and inspect the registered payloads.")
EXIT_CODES = {"succeeded": 0, "preempted": EXIT_PREEMPTED, "failed": 1}


def register(app: typer.Typer) -> None:
    app.add_typer(payload_app, name="payload")


def parse_params(pairs: list[str]) -> dict[str, Any]:
    """``k=v`` pairs; a value is read as JSON when it parses (numbers, null, lists), else as text."""
    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InputRejected(f"--param {pair!r} is not key=value", field="params")
        try:
            params[key.strip()] = json.loads(value)
        except ValueError:
            params[key.strip()] = value
    return params


def resume_source(path: Path | None) -> Path | None:
    """Accept either a checkpoint directory or an earlier --out directory holding ckpt/."""
    if path is None:
        return None
    if not path.is_dir():
        raise InputRejected(f"--resume {path} is not a directory", field="resume")
    return path / "ckpt" if (path / "ckpt").is_dir() else path


def _registry(local: bool = False):
    from upwell.payloads.registry import Registry
    from upwell.settings import Settings

    settings = Settings.from_env()
    if local:
        return Registry(None, settings.registry_allowlist)
    from upwell.cli.shared import open_storage

    storage = open_storage()
    return Registry(storage, settings.registry_allowlist)


@contextmanager
def _refusal(path: Path) -> Iterator[None]:
    """A definition that does not load, or that storage refuses: every problem on stderr, then exit 2."""
    from upwell.payloads.validate import DefinitionError

    try:
        yield
    except DefinitionError as exc:
        for problem in exc.problems:
            typer.echo(f"{path}: {problem}", err=True)
        raise typer.Exit(2) from None
    except InputRejected as exc:
        named = f"{type(exc).__name__}: " if type(exc) is not InputRejected else ""
        typer.echo(f"{path}: {named}{exc.message}", err=True)
        raise typer.Exit(2) from None


@payload_app.command("validate")
def validate_file(path: Path = typer.Argument(..., exists=True, dir_okay=False, help="a definition (YAML)")) -> None:
    """Check a definition; print every problem with its path in the file. Exit 2 when there is one."""
    from upwell.payloads.validate import load

    with _refusal(path):
        loaded = load(path.read_bytes(), str(path), _registry(local=True).allowlist)
    _echo_warnings(path, loaded)
    typer.echo(f"{path}: ok: {loaded.ref} {loaded.sha256} image {loaded.definition.image}")


def _echo_warnings(path: Path, loaded) -> None:
    """What is valid but likely a mistake (upwell.payloads.validate.warnings), on stderr; never an exit code."""
    from upwell.payloads.validate import warnings

    for problem in warnings(loaded.definition):
        typer.echo(f"{path}: warning: {problem}", err=True)


@payload_app.command("push")
def push(path: Path = typer.Argument(..., exists=True, dir_okay=False, help="a definition (YAML)")) -> None:
    """Validate a definition and register it in the payloads container (a version never changes; version
    dev may be pushed over while no open job runs it)."""
    from upwell.ledger import Ledger

    with _refusal(path):
        pushed_by = _operator(path)
        registry = _registry()
        loaded, created = registry.push(path.read_bytes(), str(path), pushed_by=pushed_by,
                                        ledger=Ledger(registry.storage))
    _echo_warnings(path, loaded)
    typer.echo(f"{'registered' if created else 'already registered'}: {loaded.ref} {loaded.sha256}")


def _operator(path: Path) -> str:
    """The caller, when they hold the operator role (issue 27: only operators register definitions);
    NotOperator is printed with its name and the command exits 2."""
    from upwell.payloads.validate import load

    d = load(path.read_bytes(), str(path), ("*",)).definition
    return _operator_of(f"{names.PAYLOADS}/{d.name}/{d.version}.yaml", str(path))


def _operator_of(blob: str, label: str) -> str:
    """The caller when they may write ``blob`` (push or delete a definition), else NotOperator and exit 2."""
    from upwell.access.caller import require_operator
    from upwell.errors import NotOperator
    from upwell.settings import Settings

    try:
        return require_operator(Settings.from_env(), blob)
    except NotOperator as exc:
        typer.echo(f"{label}: NotOperator: {exc}", err=True)
        raise typer.Exit(2) from None


@payload_app.command("delete")
def delete(ref: str = typer.Argument(..., help="NAME@VERSION of a pushed definition")) -> None:
    """Remove a pushed version; refused (PayloadInUse, exit 2) while an open job runs it, and (NotOperator)
    unless the caller holds the operator role."""
    from upwell.ledger import Ledger
    from upwell.payloads.registry import split_ref

    with _refusal(Path(ref)):
        name, version = split_ref(ref)
        _operator_of(f"{names.PAYLOADS}/{name}/{version}.yaml", ref)
        registry = _registry()
        blob = registry.delete(ref, Ledger(registry.storage))
    typer.echo(f"deleted: {ref} ({blob})")


@payload_app.command("list")
def list_payloads(local: bool = typer.Option(False, "--local", help="built-in definitions only (no storage)"),
                  as_json: bool = typer.Option(False, "--json", help="the definitions as one JSON list")) -> None:
    """List built-in and registered definitions: name, version, where, launcher, pool, params.

    Built-ins are listed even when storage cannot be read; the registered ones are then named as
    unread on stderr and the exit code is 1."""
    shown: list = []
    show = shown.append if as_json else _echo_definition
    try:
        for loaded in _registry(local=True).list():
            show(loaded)
        if not local:
            _list_registered(show)
    finally:
        if as_json:
            typer.echo(json.dumps([_definition_row(loaded) for loaded in shown], indent=1, default=str))


def _list_registered(show) -> None:
    try:
        registered = _registry(local=False)
        unreachable = _local_endpoint_down(registered.storage)
        if unreachable:
            raise TransientError(f"nothing listens at {unreachable}: start `upwell up`, or point "
                                 f"{names.CONNECTION} at the storage account")
        for loaded in registered.list():
            if not loaded.builtin:
                show(loaded)
    except UpwellError as exc:
        typer.echo(f"registered definitions not read: {str(exc).splitlines()[0]}", err=True)
        raise typer.Exit(1) from None


def _definition_row(loaded) -> dict:
    d = loaded.definition
    return {"name": d.name, "version": d.version, "where": "built-in" if loaded.builtin else "registered",
            "launcher": d.launcher.kind, "pool": d.pool,
            "params": {k: p.default for k, p in d.params.items()}}


def _echo_definition(loaded) -> None:
    """One definition per line; on a terminal its params wrap under their own column within the terminal's
    width (nothing cut), while a pipe gets each definition whole on one line, for grep."""
    import textwrap

    from upwell.cli.shared import console

    d = loaded.definition
    fields = ", ".join(f"{k}={p.default!r}" if p.default is not None else k for k, p in d.params.items())
    head = (f"{d.name:16} {d.version:8} {'built-in' if loaded.builtin else 'registered':10} "
            f"{d.launcher.kind:8} pool={d.pool:4} ")
    if not console.is_terminal or len(head) + len(fields) <= console.width:
        typer.echo(head + fields)
        return
    # Under the params column while it is 20 wide or more; else (a long name) on the lines below, indented.
    indent = len(head) if console.width - len(head) >= 20 else 4
    lines = textwrap.wrap(fields, console.width - indent, break_on_hyphens=False)
    first = lines.pop(0) if indent == len(head) else ""
    typer.echo((head + first).rstrip() + "".join("\n" + " " * indent + line for line in lines))


def _local_endpoint_down(storage) -> str:
    """The blob endpoint when it is on this machine and nothing listens there (the SDK would retry a
    refused connection for a minute and more); else ''."""
    from urllib.parse import urlsplit

    from upwell.local.azurite import port_open

    url = urlsplit(storage.blobs.url)
    if url.hostname in ("127.0.0.1", "localhost") and url.port and not port_open(url.port, url.hostname):
        return f"{url.hostname}:{url.port}"
    return ""


class FileDefinition:
    """A definition file on this machine as the launcher's registry: it resolves its own name only, so
    ``upwell payload run FILE.yaml`` runs it under the agent's contract before it is pushed."""

    def __init__(self, loaded) -> None:
        self.loaded = loaded

    def resolve(self, ref: str, *, sha256: str = ""):
        if ref.partition("@")[0] != self.loaded.definition.name or (sha256 and sha256 != self.loaded.sha256):
            raise InputRejected(f"payload {ref!r} is not the file's {self.loaded.ref}", field="payload")
        return self.loaded


def _definitions(name: str):
    """(the registry to run from, the definition): a definition file (.yaml, .yml, .json) as it is, a
    built-in without storage, a pushed one from the payloads container."""
    if name.endswith((".yaml", ".yml", ".json")):
        from upwell.payloads.validate import load

        path = Path(name)
        if not path.is_file():
            raise InputRejected(f"{name}: no such definition file", field="payload")
        with _refusal(path):
            loaded = load(path.read_bytes(), name, _registry(local=True).allowlist)
        _echo_warnings(path, loaded)
        return FileDefinition(loaded), loaded
    definitions = _registry(local=name in _registry(local=True).names())
    return definitions, definitions.resolve(name)


@payload_app.command("run")
def run(name: str = typer.Argument(..., help="a payload name, or a definition file (FILE.yaml) not pushed yet"),
        param: list[str] = typer.Option([], "--param", "-p", help="parameter as key=value (repeatable)"),
        ranks: int = typer.Option(1, min=1, max=256, help="MPI ranks or torchrun processes"),
        gpus: int = typer.Option(0, min=0, help="GPUs the payload is given, that many of this machine's "
                                 "(CUDA_VISIBLE_DEVICES)"),
        input_path: Path | None = typer.Option(None, "--input", exists=True, dir_okay=False,
                                               help="input file for payloads that need one"),
        out: Path | None = typer.Option(None, help="copy out/, ckpt/ and payload.log here"),
        resume: Path | None = typer.Option(None, help="checkpoint dir (or an earlier --out dir) to resume from"),
        attempt: int = typer.Option(1, min=1, help="attempt number written to item.json"),
        timeout: float | None = typer.Option(None, help="seconds before the payload is stopped and failed"),
        workdir: Path | None = typer.Option(None, help="work directory (default: a new temporary one)")) -> None:
    """Run one payload locally, once, through the same launcher the worker agent uses; a definition file
    runs as it is, with nothing pushed."""
    from upwell.payloads import params as payload_params

    try:
        definitions, loaded = _definitions(name)
        params = parse_params(param)
        payload_params.validate(loaded.definition, params)
        resume_dir = resume_source(resume)
    except InputRejected as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    item = WorkItem(job_id="local", shard_id=f"local-{uuid.uuid4().hex[:8]}", payload=loaded.definition.name,
                    pool=loaded.definition.pool, params=params, attempt=attempt, ranks=ranks, gpus=gpus,
                    payload_version=loaded.definition.version, payload_sha256=loaded.sha256)
    result = _run_with_signals(item, workdir, input_path, resume_dir, timeout, definitions)
    doc = result.to_dict()
    if out is not None:
        doc = _copy_out(Path(doc["checkpoint_dir"]), out, doc, keep=workdir is not None)
    typer.echo(json.dumps(doc, indent=1, default=str))
    raise typer.Exit(EXIT_CODES.get(result.status, 1))


def _run_with_signals(item: WorkItem, workdir: Path | None, input_path: Path | None, resume_dir: Path | None,
                      timeout: float | None, definitions=None):
    from workers.launch import run_payload

    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        where = workdir or Path(tempfile.mkdtemp(prefix="upwell-payload-"))
        return run_payload(item, where, input_path=input_path, resume_dir=resume_dir, stop=stop, timeout_s=timeout,
                           definitions=definitions)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _copy_out(kept: Path, out: Path, doc: dict[str, Any], *, keep: bool) -> dict[str, Any]:
    """Copy out/, the kept checkpoint (as ckpt/, what --resume reads) and payload.log to ``out``; point the
    result's paths there. ``kept``: the folder the launcher kept the checkpoint in, inside the work dir."""
    workdir = kept.parent
    out.mkdir(parents=True, exist_ok=True)
    for src, sub in ((workdir / "out", "out"), (kept, "ckpt")):
        shutil.rmtree(out / sub, ignore_errors=True)
        shutil.copytree(src, out / sub)
    if (workdir / "payload.log").exists():
        shutil.copy2(workdir / "payload.log", out / "payload.log")
    doc = dict(doc, artifacts=[str(out / Path(a).relative_to(workdir)) for a in doc["artifacts"]],
               checkpoint_dir=str(out / "ckpt"), log_path=str(out / "payload.log"))
    (out / "result.json").write_text(json.dumps(doc, indent=1, default=str))
    if not keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return doc
