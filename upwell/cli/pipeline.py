"""Commands for the embedded default: up, submit, rules, status, watch, report, demo."""

from __future__ import annotations

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
from upwell.cli.shared import err, open_storage, piped, print_actions, print_json, resolve

console = Console(stderr=False)
STATE = Path(os.environ.get("UPWELL_HOME", ".upwell"))
REPO = Path(__file__).resolve().parents[2]


def up(http_port: int = typer.Option(7071, help="port of the devhost's HTTP triggers (127.0.0.1)"),
       blob_port: int = typer.Option(10000, help="Azurite blob port"),
       queue_port: int = typer.Option(10001, help="Azurite queue port"),
       table_port: int = typer.Option(10002, help="Azurite table port"),
       workers: str = typer.Option(None, help="local workers: N for every local pool, or cpu=4,mpi=1"),
       free_ports: bool = typer.Option(
           False, "--free-ports", help="when the ports belong to another checkout's stack, use free ones")) -> None:
    """Start Azurite (persisted under .upwell/), the local Functions host and the local pool. Ctrl-C stops all."""
    from upwell.local import owner
    from upwell.local.stack import LocalStack, clear_state, save_state

    ports, http_port = _choose_ports((blob_port, queue_port, table_port), http_port, free_ports)
    _pools_for_up(workers)
    stack = LocalStack(STATE, http_port=http_port, ports=ports)
    stopping = threading.Event()
    # Handlers before any child exists, and every child started inside try/finally: a Ctrl-C, a kill or a
    # closed terminal at any moment, even during start-up, stops whatever was started.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: stopping.set())
    died = False
    try:
        save_state(STATE, "starting", ports, http_port)  # other commands wait for a starting stack, bounded
        stack.start_storage()
        owner.claim("up", STATE, ports, http_port)
        where = (f"started, data in {STATE / 'azurite'}" if stack.azurite is not None else
                 "REUSED: an Azurite that upwell did not start here already listens there; its data is wherever "
                 f"it keeps it, not in {STATE / 'azurite'}")
        _say(f"[green]storage[/] Azurite on 127.0.0.1:{ports[0]}/{ports[1]}/{ports[2]} ({where})")
        if stopping.is_set():
            return
        stack.start_devhost()
        stack.wait_subscribed()
        _say(f"[green]functions[/] devhost pid {stack.devhost.pid}; HTTP on "
             f"http://127.0.0.1:{http_port}/api/jobs")
        _say(f"[green]dashboard[/] http://127.0.0.1:{http_port}/api/dashboard")
        state = save_state(STATE, "ready", ports, http_port)
        _say(f"[green]connection[/] for Storage Explorer or `az ... --connection-string`: "
             f"{_quoted(state.connection_string)} (other upwell commands find it in {STATE / 'stack.json'})")
        _say("[green]ready[/] upload with `upwell submit PATH` or any Azure Storage client. Ctrl-C stops everything.")
        while not stopping.is_set() and stack.alive():
            stopping.wait(0.5)
        died = not stopping.is_set()
    finally:
        _say("[yellow]stopping[/] devhost, workers, Azurite ...")
        stack.stop()
        owner.release(ports[0])
        clear_state(STATE)
        _say("[green]stopped[/]")
    if died:
        _say(f"[red]the functions host exited on its own[/]; its output is above (is port {http_port} in use?)")
        raise typer.Exit(1)


def _quoted(connection: str) -> str:
    """The standard ports' connection string is the short one every Azure Storage tool knows."""
    from upwell.local import azurite

    return '"UseDevelopmentStorage=true"' if connection == azurite.connection_string() else f'"{connection}"'


def _choose_ports(ports: tuple[int, int, int], http_port: int, free: bool) -> tuple[tuple[int, int, int], int]:
    """The ports `up` uses: refuse a second `up` of this checkout, and another checkout's stack unless --free-ports."""
    from upwell.local import azurite, owner

    info = owner.owner(ports[0])
    if info and owner.same_home(info, STATE):
        _say(f"[red]upwell up already runs here[/]: {owner.describe(info)}. Use that one (submit, status and "
             "watch reach it), or stop it with Ctrl-C in its terminal.")
        raise typer.Exit(1)
    if info and not free:
        _say(f"[red]these ports belong to another checkout's stack[/]: {owner.describe(info)}. Stop that one, or "
             "start this one with --free-ports (or --blob-port/--queue-port/--table-port/--http-port).")
        raise typer.Exit(1)
    if info:
        blob, queue, table, http = azurite.free_ports(4)
        _say(f"[yellow]ports {ports[0]}-{ports[2]} and {http_port} belong to {owner.describe(info)}[/]; this "
             f"stack uses free ports: Azurite {blob}/{queue}/{table}, functions {http}. Its clients need these "
             f"endpoints: blob http://127.0.0.1:{blob}/{azurite.ACCOUNT}, queue :{queue}, table :{table}")
        return (blob, queue, table), http
    if azurite.port_open(http_port):
        _say(f"[red]port {http_port} is in use[/] (another functions host?); pick another with --http-port")
        raise typer.Exit(1)
    return ports, http_port


def _pools_for_up(workers: str | None) -> None:
    """Apply --workers, give each worker its share of the cores, print the pool table, warn on oversubscription."""
    from upwell.errors import ConfigError
    from upwell.local import workers as local_workers
    from upwell.settings import Settings

    try:
        pools = local_workers.with_workers(Settings.from_env().pools, workers)
    except ConfigError as exc:
        _say(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    cores = local_workers.cores()
    threads, chosen = local_workers.threads_per_worker(pools, dict(os.environ), cores)
    os.environ["UPWELL_POOLS"] = local_workers.to_setting(pools)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    table = Table(title=f"pools ({cores} cores; threads each {'from OMP_NUM_THREADS' if chosen else 'shared out'})")
    for header in local_workers.HEADERS:
        table.add_column(header, no_wrap=True)
    for row in local_workers.table_rows(pools, threads):
        table.add_row(*row)
    _say(table)
    for warning in local_workers.oversubscribed(pools, threads, cores):
        _say(f"[yellow]warning[/] {warning}")


def _say(text) -> None:
    """Print, unless the terminal is gone (SIGHUP): stopping the children matters more than the message."""
    try:
        console.print(text, soft_wrap=isinstance(text, str))
    except OSError:
        pass


def submit(paths: list[Path] = typer.Argument(..., help="files or folders to upload"),
           prefix: str = typer.Option("", help="folder under incoming/ to upload into"),
           dry_run: bool = typer.Option(False, "--dry-run", help="validate and estimate; upload nothing"),
           wait: bool = typer.Option(False, "--wait", help="then watch the jobs until they are reported"),
           timeout: float = typer.Option(900.0, help="with --wait: give up after this many seconds")) -> None:
    """Validate, then upload files or folders to incoming/, as a collaborator would."""
    from rich.markup import escape

    from upwell.errors import InputRejected
    from upwell.ingest.submit import check
    from upwell.ingest.submit import submit as do_submit

    storage = open_storage(needs_host=not dry_run)
    try:
        plans = check(storage, paths, prefix)
    except (InputRejected, FileNotFoundError) as exc:
        # A named error (upwell.shape's TooManyNodes ...) says its name: the one a script or the docs look for.
        named = f"{type(exc).__name__}: " if isinstance(exc, InputRejected) and type(exc) is not InputRejected else ""
        console.print(f"[red]refused[/] (nothing uploaded): {escape(named + str(getattr(exc, 'message', exc)))}",
                      soft_wrap=True)
        raise typer.Exit(2) from None
    for p in plans:
        shards = f"{p.shards} shard(s)" if p.shards is not None else "shards counted at ingest"
        shards += f" of {p.nodes} nodes each" if p.nodes > 1 else ""
        budget = f", budget ${p.budget_usd:.2f}" if p.budget_usd is not None else ""
        console.print(f"ok incoming/{p.blob}: {p.payload} on pool {p.pool}, {shards}; estimate "
                      f"{p.node_seconds:.0f} node-s = ${p.usd:.4f} (range ${p.usd_low:.4f}-${p.usd_high:.4f}) "
                      f"on {p.price_key}{' (spot)' if p.spot else ''}{budget}; {p.basis}", soft_wrap=True,
                      markup=False)
    if dry_run:
        console.print("dry run: nothing uploaded")
        return
    jobs = []
    for up_ in do_submit(storage, paths, prefix):
        job = f"job [bold]{up_.job_id}[/]" if up_.job_id else "input"
        console.print(f"uploaded {up_.local} -> incoming/{up_.blob}  ({job})", soft_wrap=True)
        jobs += [up_.job_id] if up_.job_id else []
    if wait and jobs:
        final = watch_jobs(jobs, timeout)
        for job_id, st in final.items():
            console.print(f"{job_id}: {st.get('status')}", soft_wrap=True, markup=False)
        if not all(st.get("reported") and st.get("status") == "succeeded" for st in final.values()):
            raise typer.Exit(1)


def rules(paths: list[Path] = typer.Argument(..., help="rule files or folders of rules")) -> None:
    """Upload pipeline rules to the pipelines container (operators only: upwell.access.caller)."""
    from upwell.access.caller import require_operator
    from upwell.errors import NotOperator
    from upwell.ingest.submit import push_rules
    from upwell.settings import Settings

    try:
        require_operator(Settings.from_env(), f"{names.PIPELINES}/{Path(paths[0]).name}")
    except NotOperator as exc:
        err.print(f"NotOperator: {exc}", markup=False, soft_wrap=True)
        raise typer.Exit(2) from None
    for name in push_rules(open_storage(), paths):
        console.print(f"rule pipelines/{name}")


def status(job: str = typer.Argument(None, help="a job id, name or upload path; all jobs when omitted"),
           as_json: bool = typer.Option(False, "--json")) -> None:
    """Report where jobs stand."""
    storage = open_storage()  # before the library's imports: with the stack down, say so at once
    from upwell.results.status import job_status, list_jobs

    if job:
        job = resolve(storage, job)
        st = job_status(storage, job)
        if st is None:
            console.print(f"[red]no such job {job}[/]")
            raise typer.Exit(1)
        if as_json:
            print_json(st)
            return
        _print_job(st)
        return
    rows = list_jobs(storage)
    if as_json:
        print_json(rows)
        return
    console_table = _jobs_table(rows)
    # A pipe or a file: as wide as the rows need, not 80 columns.
    out = console if console.is_terminal else Console(width=max(console.width, console_table.columns[0].min_width
                                                                  + 140))
    out.print(console_table)
    _messages(rows, out)
    from upwell.ops.reconcile import recent_actions

    actions = recent_actions(storage, limit=10)
    if actions:
        print_actions(actions, "reconciler: latest actions")


def _jobs_table(rows: list[dict]) -> Table:
    """The job listing, narrow enough for 80 columns: no vertical rules, the shard counts in one column
    (done/failed/of); a job's message goes below the table (``_messages``), word-wrapped, never cut."""
    from rich import box

    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, show_edge=False, collapse_padding=True,
                  caption="shards: done/failed/of")
    # Whole ids, never cut or folded, at any terminal width or none: the id is what the other commands take.
    table.add_column("job", no_wrap=True, overflow="ignore", min_width=max([len(r["job_id"]) for r in rows] or [3]))
    for header in ("status", "payload", "pool", "shards", "cost $"):
        table.add_column(header, overflow="fold")
    for r in rows:
        shards = f"{r.get('shards_done') or 0}/{r.get('shards_failed') or 0}/{r.get('shards_total') or 0}"
        table.add_row(r["job_id"], r.get("status") or "", r.get("payload") or "", r.get("pool") or "", shards,
                      f"{float(r.get('spent_usd') or 0):.4f}")
    return table


def _messages(rows: list[dict], out: Console) -> None:
    for r in rows:
        if r.get("message"):
            out.print(f"{r['job_id']}: {r['message']}", markup=False, highlight=False)


def _print_job(st: dict) -> None:
    s = st["shards"]
    console.print(f"[bold]{st['job_id']}[/] {st.get('name') or ''}: [bold]{st.get('status')}[/]", soft_wrap=piped())
    cancelled = f", {s['cancelled']} cancelled" if s.get("cancelled") else ""
    console.print(f"  shards: {s['succeeded']} done, {s['failed']} failed, {s['running']} running, "
                  f"{s['queued']} queued{cancelled}, of {s['total']}")
    console.print(f"  workers: {', '.join(st['workers']) or '-'}; cost so far ${float(st.get('spent_usd') or 0):.4f} "
                  f"(estimate ${float(st.get('estimate_usd') or 0):.4f})")
    if st.get("message"):
        console.print(f"  [yellow]{st['message']}[/]")
    for f in st.get("failures", []):
        console.print(f"  [red]failed {f['shard']}[/]: {f['error']}")
    if st.get("quarantine_blob"):
        console.print(f"  quarantined as {st['quarantine_blob']} (see its .error.json)")
    for line in st.get("after_lines", []):  # the chain, the analysis, a failed notification (upwell.after)
        console.print(f"  {line}", soft_wrap=piped(), markup=False)


def watch_jobs(job_ids: list[str], timeout: float = 900.0) -> dict[str, dict]:
    """Live progress until every job is reported (or rejected); returns the last statuses."""
    from upwell.results.status import job_status

    storage = open_storage()
    final: dict[str, dict] = {}
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
               TimeElapsedColumn())
    deadline = time.monotonic() + timeout
    with Progress(*columns, console=console, transient=False) as progress:
        tasks = {j: progress.add_task(j, total=None, info="waiting") for j in job_ids}
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
                if st.get("reported") or st.get("status") in ("rejected", "cancelled"):
                    final[job] = st
            time.sleep(0.5)
    for job in job_ids:
        if job not in final:
            final[job] = job_status(storage, job) or {"job_id": job, "status": "unknown"}
    return final


def watch(job: list[str] = typer.Argument(..., help="job ids, names or upload paths"),
          timeout: float = typer.Option(900.0, help="give up after this many seconds")) -> None:
    """Live progress: shards queued, running, done and failed; workers; cost so far."""
    final = watch_jobs([_known_job(j) for j in job], timeout)
    if not all(st.get("reported") for st in final.values()):
        raise typer.Exit(1)


def _known_job(text: str) -> str:
    """A job that exists, or an id or path whose upload is in incoming/ and not yet ingested (the job that its
    ingest will create); else 'no such job' now."""
    from upwell.lifecycle.find import NoSuchJob, find_job, pending_path, pending_upload

    storage = open_storage()
    try:
        return find_job(storage, text).job_id
    except NoSuchJob as exc:
        if not any(c in text for c in "/\\#?") and pending_upload(storage, text):
            return text  # uploaded a moment ago: its ingest will create it
        if job_id := pending_path(storage, text):
            return job_id  # `watch runs/x` right after `submit ... --prefix runs/`
        err.print(f"[red]{exc}[/]", soft_wrap=True)
        raise typer.Exit(1) from None


def fetch_report(job_id: str, dest_root: Path | None = None) -> Path:
    storage = open_storage()
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


def report(job: str = typer.Argument(..., help="job id, name or upload path")) -> None:
    """Download a job's report to .upwell/reports/<job>/ and print its index.html."""
    try:
        console.print(str(fetch_report(resolve(open_storage(), job))), soft_wrap=True, markup=False)
    except FileNotFoundError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(1) from None


def demo(timeout: float = typer.Option(900.0, help="seconds to wait for all reports"),
         samples: Path = typer.Option(REPO / "samples", help="the samples folder")) -> None:
    """Start everything, submit every sample, watch them, save each report and print the paths."""
    from upwell.local.demo import run_demo

    raise typer.Exit(run_demo(samples, STATE, timeout, console, watch_jobs, fetch_report))


def register(app: typer.Typer) -> None:
    for fn in (up, submit, rules, status, watch, report, demo):
        app.command()(fn)
