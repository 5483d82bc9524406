"""`upwell demo`: every sample through the whole local pipeline, reports saved to .upwell/reports/."""

from __future__ import annotations

import os
from pathlib import Path

from upwell import names
from upwell.ingest.submit import push_rules, submit
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


def run_demo(samples: Path, state: Path, timeout: float, console, watch_jobs, fetch_report, *,
             ports: tuple[int, int, int] | None = None, http_port: int = 7071) -> int:
    stack = LocalStack(state, quiet=True, http_port=http_port, **({"ports": ports} if ports else {}))
    os.environ[names.CONNECTION] = stack.connection_string
    console.print("[bold]upwell demo[/]: starting Azurite and the local Functions host ...")
    try:
        stack.start()
        if not stack.alive():
            console.print(f"[red]the local Functions host did not start[/]: see {state / 'logs' / 'devhost.log'}")
            return 1
        rules, uploads = sample_uploads(samples)
        for r in push_rules(stack.storage, rules):
            console.print(f"  rule pipelines/{r}")
        jobs = []
        for path, prefix in uploads:
            for up in submit(stack.storage, [path], prefix):
                if up.job_id:
                    jobs.append(up.job_id)
                    console.print(f"  submitted incoming/{up.blob} -> job {up.job_id}")
        console.print(f"watching {len(jobs)} jobs (workers scale with the queues; logs in {state / 'logs'}) ...")
        final = watch_jobs(jobs, timeout)
        ok = True
        console.print("\n[bold]reports[/]")
        for job in jobs:
            st = final[job]
            if not st.get("reported"):
                ok = False
                console.print(f"  [red]{job}: not reported[/] (status {st.get('status')}, {st.get('message') or ''})")
                continue
            path = fetch_report(job, state / "reports")
            console.print(f"  {job} ({st.get('status')}): {path}", soft_wrap=True, markup=False)
        return 0 if ok else 1
    finally:
        console.print("stopping ...")
        stack.stop()
