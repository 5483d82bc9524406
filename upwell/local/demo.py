"""`upwell demo`: every sample through the whole local pipeline, reports saved to .upwell/reports/."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from upwell import names
from upwell.ingest.submit import push_rules, submit
from upwell.local import azurite, owner
from upwell.local.stack import LocalStack


def sample_uploads(samples: Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    """(rule folders, [(path, prefix)]): every folder with a job manifest, and every instrument drop."""
    rules = [samples / "pipelines"] if (samples / "pipelines").is_dir() else []
    uploads = [(d, "demo/") for d in sorted(samples.iterdir())
               if d.is_dir() and any((d / m).exists() for m in ("job.yaml", "job.yml", "job.json"))]
    drops = samples / "instrument"
    if drops.is_dir():
        uploads += [(f, "instruments/buoy/") for f in sorted(drops.glob("*.csv"))]
    return rules, uploads


def _own_stack(state: Path, console) -> LocalStack:
    """The demo's stack: on the default ports when they are free; else on free ports with its own state
    folder, saying whose stack holds the defaults (never attaching to another stack's Azurite and workers)."""
    info = owner.owner(azurite.DEFAULT_PORTS[0])
    busy = info or any(azurite.port_open(p) for p in (*azurite.DEFAULT_PORTS, 7071))
    if not busy:
        return LocalStack(state, quiet=True)
    who = owner.describe(info) if info else "a process that upwell did not start (an Azurite or a host)"
    blob, queue, table, http = azurite.free_ports(4)
    console.print(f"the default ports are in use by {who}; the demo runs its own Azurite, host and workers on "
                  f"ports {blob}/{queue}/{table} and {http}, with its data in {state / 'demo'}", soft_wrap=True,
                  markup=False)
    return LocalStack(state / "demo", quiet=True, ports=(blob, queue, table), http_port=http)


# How to add a third-party tool a sample's definition runs, by the tool's name on PATH.
HOW_TO_ADD = {"gmx": "as root run `make gromacs` (apt-get install gromacs), then `make demo` again"}


def missing_tool(folder: Path) -> str | None:
    """The tool a sample's payload definition runs when it is not on PATH (its samples are skipped), else None."""
    from upwell.documents import parse_document
    from upwell.payloads.registry import builtins

    manifest = next((folder / m for m in ("job.yaml", "job.yml", "job.json") if (folder / m).exists()), None)
    if manifest is None:
        return None
    try:
        payload = str(parse_document(manifest.read_bytes(), manifest.name).get("payload") or "")
    except Exception:  # noqa: BLE001 - a bad sample is the ingestor's to reject, with its error file
        return None
    loaded = builtins().get(payload.split("@", 1)[0])
    if loaded is None or loaded.definition.module:
        return None
    tool = loaded.definition.command[0]
    return None if "{" in tool or shutil.which(tool) else tool


def run_demo(samples: Path, state: Path, timeout: float, console, watch_jobs, fetch_report) -> int:
    stack = _own_stack(state, console)
    state = stack.root
    os.environ[names.CONNECTION] = stack.connection_string
    console.print("[bold]upwell demo[/]: starting Azurite and the local Functions host ...")
    try:
        stack.start()
        owner.claim("demo", state, stack.ports, stack.http_port)
        if not stack.alive():
            console.print(f"[red]the local Functions host did not start[/]: see {state / 'logs' / 'devhost.log'}")
            return 1
        rules, uploads = sample_uploads(samples)
        for path, _ in list(uploads):
            tool = path.is_dir() and missing_tool(path)
            if tool:
                uploads.remove((path, _))
                console.print(f"  skipped {path.name}: its payload runs `{tool}`, which is not installed; to add it, "
                              f"{HOW_TO_ADD.get(tool, f'put {tool} on PATH')}", soft_wrap=True, markup=False)
        for r in push_rules(stack.storage, rules):
            console.print(f"  rule pipelines/{r}")
        jobs = []
        for path, prefix in uploads:
            for up in submit(stack.storage, [path], prefix):
                if up.job_id:
                    jobs.append(up.job_id)
                    console.print(f"  submitted incoming/{up.blob} -> job {up.job_id}", soft_wrap=True)
        console.print(f"watching {len(jobs)} jobs (workers scale with the queues; logs in {state / 'logs'}) ...")
        final = watch_jobs(jobs, timeout)
        ok = True
        console.print("\n[bold]reports[/]")
        for job in jobs:
            st = final[job]
            if not st.get("reported"):
                ok = False
                console.print(f"  [red]{job}: not reported[/] (status {st.get('status')}, {st.get('message') or ''})",
                              soft_wrap=True)
                continue
            path = fetch_report(job, state / "reports")
            console.print(f"  {job} ({st.get('status')}): {path}", soft_wrap=True, markup=False)
        return 0 if ok else 1
    finally:
        console.print("stopping ...")
        stack.stop()
        owner.release(stack.ports[0])
