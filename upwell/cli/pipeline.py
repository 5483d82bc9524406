"""Commands for the embedded default: up, submit, rules, status, watch, report, demo."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from upwell import names

console = Console(stderr=False)
STATE = Path(os.environ.get("UPWELL_HOME", ".upwell"))
REPO = Path(__file__).resolve().parents[2]


def _storage():
    from upwell.storage import Storage

    identity = any(k.startswith(f"{names.CONNECTION}__") for k in os.environ)
    if not os.environ.get(names.CONNECTION) and not identity:
        os.environ[names.CONNECTION] = "UseDevelopmentStorage=true"  # the local emulator by default
    return Storage()


def up(http_port: int = typer.Option(7071, help="port of the devhost's HTTP triggers (127.0.0.1)"),
       blob_port: int = typer.Option(10000, help="Azurite blob port"),
       queue_port: int = typer.Option(10001, help="Azurite queue port"),
       table_port: int = typer.Option(10002, help="Azurite table port")) -> None:
    """Start Azurite (persisted under .upwell/), the local Functions host and the local pool. Ctrl-C stops all."""
    from upwell.local.stack import LocalStack

    stack = LocalStack(STATE, http_port=http_port, ports=(blob_port, queue_port, table_port))
    stopping = threading.Event()
    # Handlers before any child exists, and every child started inside try/finally: a Ctrl-C, a kill or a
    # closed terminal at any moment, even during start-up, stops whatever was started.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: stopping.set())
    try:
        stack.start_storage()
        _say(f"[green]storage[/] Azurite on 127.0.0.1:{blob_port}/{queue_port}/{table_port} "
             f"({'reused' if stack.azurite is None else 'started'}, data in {STATE / 'azurite'})")
        if stopping.is_set():
            return
        stack.start_devhost()
        stack.wait_subscribed()
        _say(f"[green]functions[/] devhost pid {stack.devhost.pid}; HTTP on "
             f"http://127.0.0.1:{http_port}/api/jobs")
        _say(f"[green]dashboard[/] http://127.0.0.1:{http_port}/api/dashboard")
        _say("[green]ready[/] upload with `upwell submit PATH` or any Azure Storage client "
             "(UseDevelopmentStorage=true). Ctrl-C stops everything.")
        while not stopping.is_set() and stack.alive():
            stopping.wait(0.5)
    finally:
        _say("[yellow]stopping[/] devhost, workers, Azurite ...")
        stack.stop()
        _say("[green]stopped[/]")


def _say(text: str) -> None:
    """Print, unless the terminal is gone (SIGHUP): stopping the children matters more than the message."""
    try:
        console.print(text)
    except OSError:
        pass


def submit(paths: list[Path] = typer.Argument(..., help="files or folders to upload"),
           prefix: str = typer.Option("", help="folder under incoming/ to upload into")) -> None:
    """Upload files or folders to incoming/, as a collaborator would."""
    from upwell.ingest.submit import submit as do_submit

    for up_ in do_submit(_storage(), paths, prefix):
        job = f"job [bold]{up_.job_id}[/]" if up_.job_id else "input"
        console.print(f"uploaded {up_.local} -> incoming/{up_.blob}  ({job})")


def rules(paths: list[Path] = typer.Argument(..., help="rule files or folders of rules")) -> None:
    """Upload pipeline rules to the pipelines container."""
    from upwell.ingest.submit import push_rules

    for name in push_rules(_storage(), paths):
        console.print(f"rule pipelines/{name}")


def status(job: str = typer.Argument(None, help="a job id; all jobs when omitted"),
           as_json: bool = typer.Option(False, "--json")) -> None:
    """Report where jobs stand."""
    from upwell.results.status import job_status, list_jobs

    storage = _storage()
    if job:
        st = job_status(storage, job)
        if st is None:
            console.print(f"[red]no job {job}[/]")
            raise typer.Exit(1)
        if as_json:
            console.print_json(json.dumps(st, default=str))
            return
        _print_job(st)
        return
    rows = list_jobs(storage)
    if as_json:
        console.print_json(json.dumps(rows, default=str))
        return
    table = Table("job", "status", "payload", "pool", "done", "failed", "total", "cost $", "message")
    for r in rows:
        table.add_row(r["job_id"], r.get("status") or "", r.get("payload") or "", r.get("pool") or "",
                      str(r.get("shards_done") or 0), str(r.get("shards_failed") or 0), str(r.get("shards_total") or 0),
                      f"{float(r.get('spent_usd') or 0):.4f}", (r.get("message") or "")[:60])
    console.print(table)
    from upwell.cli.reconcile import print_actions
    from upwell.ops.reconcile import recent_actions

    actions = recent_actions(storage, limit=10)
    if actions:
        print_actions(actions, "reconciler: latest actions")


def _print_job(st: dict) -> None:
    s = st["shards"]
    console.print(f"[bold]{st['job_id']}[/] {st.get('name') or ''}: [bold]{st.get('status')}[/]")
    console.print(f"  shards: {s['succeeded']} done, {s['failed']} failed, {s['running']} running, "
                  f"{s['queued']} queued, {s['preempted']} preempted, of {s['total']}")
    console.print(f"  workers: {', '.join(st['workers']) or '-'}; cost so far ${float(st.get('spent_usd') or 0):.4f} "
                  f"(estimate ${float(st.get('estimate_usd') or 0):.4f})")
    if st.get("message"):
        console.print(f"  [yellow]{st['message']}[/]")
    for f in st.get("failures", []):
        console.print(f"  [red]failed {f['shard']}[/]: {f['error']}")
    if st.get("quarantine_blob"):
        console.print(f"  quarantined as {st['quarantine_blob']} (see its .error.json)")


def watch_jobs(job_ids: list[str], timeout: float = 900.0) -> dict[str, dict]:
    """Live progress until every job is reported (or rejected); returns the last statuses."""
    from upwell.results.status import job_status

    storage = _storage()
    final: dict[str, dict] = {}
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
               TimeElapsedColumn())
    deadline = time.monotonic() + timeout
    with Progress(*columns, console=console, transient=False) as progress:
        tasks = {j: progress.add_task(j[:40], total=None, info="waiting") for j in job_ids}
        while len(final) < len(job_ids) and time.monotonic() < deadline:
            for job in job_ids:
                if job in final:
                    continue
                st = job_status(storage, job)
                if st is None:
                    continue
                s = st["shards"]
                info = (f"{s['queued']} queued {s['running']} running {s['succeeded']} done {s['failed']} failed "
                        f"| workers {len(st['workers'])} | ${float(st.get('spent_usd') or 0):.4f} | {st.get('status')}")
                if st.get("message"):
                    info += f" | {st['message'][:60]}"
                progress.update(tasks[job], total=st.get("shards_total") or s["total"] or None,
                                completed=s["succeeded"] + s["failed"], info=info)
                if st.get("reported") or st.get("status") == "rejected":
                    final[job] = st
            time.sleep(0.5)
    for job in job_ids:
        if job not in final:
            final[job] = job_status(storage, job) or {"job_id": job, "status": "unknown"}
    return final


def watch(job: list[str] = typer.Argument(..., help="job ids"),
          timeout: float = typer.Option(900.0, help="give up after this many seconds")) -> None:
    """Live progress: shards queued, running, done and failed; workers; cost so far."""
    final = watch_jobs(job, timeout)
    if not all(st.get("reported") for st in final.values()):
        raise typer.Exit(1)


def fetch_report(job_id: str, dest_root: Path | None = None) -> Path:
    storage = _storage()
    dest = (dest_root or STATE / "reports") / job_id
    found = False
    for blob in storage.list(names.REPORTS, f"{job_id}/"):
        rel = blob.name[len(job_id) + 1:]
        if ".." in rel.split("/"):
            continue
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(storage.read(f"{names.REPORTS}/{blob.name}"))
        found = True
    if not found:
        raise FileNotFoundError(f"no report for job {job_id} yet (reports/{job_id}/)")
    return (dest / "index.html").resolve()


def report(job: str = typer.Argument(..., help="job id")) -> None:
    """Download a job's report to .upwell/reports/<job>/ and print its index.html."""
    try:
        console.print(str(fetch_report(job)), soft_wrap=True)
    except FileNotFoundError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(1) from None


def demo(timeout: float = typer.Option(900.0, help="seconds to wait for all reports"),
         samples: Path = typer.Option(REPO / "samples", help="the samples folder"),
         http_port: int = typer.Option(7071, help="port of the devhost's HTTP triggers and blobs webhook"),
         blob_port: int = typer.Option(10000, help="Azurite blob port (queue and table: the next two)")) -> None:
    """Start everything, submit every sample, watch them, save each report and print the paths."""
    from upwell.local.demo import run_demo

    ports = (blob_port, blob_port + 1, blob_port + 2)
    raise typer.Exit(run_demo(samples, STATE, timeout, console, watch_jobs, fetch_report,
                              ports=ports, http_port=http_port))


def register(app: typer.Typer) -> None:
    for fn in (up, submit, rules, status, watch, report, demo):
        app.command()(fn)
