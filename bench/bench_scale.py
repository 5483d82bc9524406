"""How each cost grows with the work: a small and a big sweep, and the reads that follow them (issue 24).

For each size (``--small`` 1,000 and ``--big`` 100,000 points by default), in a fresh in-memory Azurite:

1. a logistic sweep manifest is ingested in this process (the real Ingestor): the time until every work
   item is enqueued, and that time per shard;
2. ``upwell status JOB`` (``upwell.results.status.job_status``) and the dashboard's job view
   (``upwell.ops.dashboard.job_detail``: the job and its first page of shards) are timed on that job, the
   median of five;
3. for the report, ``--report-small`` and ``--report-big`` shards of such a job are given a result each
   and the job is marked done; the report's build (``upwell.results.publish.publish``) is timed, the median
   of ``REPORT_BUILDS`` builds (the first in a process also imports the plotting and templating libraries).

Then the requests per shard of a sweep end to end at each of the ``--requests`` sizes (50 and 100 shards:
ingest, agent, collect, report, the scale timer's share, the devhost's blob-trigger queue traffic;
``tests/faults/request_meter.py``), each in a fresh Azurite, and the
requests of one idle tick of each timer (the scale timer, the reconciler's pass, the janitor) on an idle stack
after ``--idle-small`` and ``--idle-big`` finished jobs (``tests/faults/test_idle_reads.py``), with the
requests per idle minute under `upwell up`'s schedules.

The ratios are big ÷ small of the time per shard (ingest) or of the time (status, dashboard, report).

    .venv/bin/python bench/bench_scale.py [--small 1000] [--big 100000] [--report-small 1000]
        [--report-big 10000] [--requests 50,100] [--idle-small 10] [--idle-big 200] [--json bench/out/scale.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from upwell import names
from upwell.access.principal import Caller
from upwell.ingest.ingestor import Ingestor
from upwell.ledger import JobState, Ledger
from upwell.local import azurite
from upwell.ops import dashboard
from upwell.ops.jobapi import JobAPI
from upwell.results import publish
from upwell.results.status import job_status
from upwell.settings import Settings
from upwell.storage import Storage

REPORT_BUILDS = 3


def manifest(n: int) -> bytes:
    """A logistic sweep of ``n`` points: r × x0, at most 1,000 values a dimension (a document's value limit)."""
    x0 = max(1, -(-n // 1000))
    r = -(-n // x0)
    rs = ", ".join(f"{3.0 + i / (2 * r):.6f}" for i in range(r))
    starts = ", ".join(f"{0.1 + i / (2 * x0):.6f}" for i in range(x0))
    return (f"payload: logistic\nparams: {{steps: 50, burn_in: 10}}\n"
            f"grid: {{r: [{rs}], x0: [{starts}]}}\n").encode()


def ingest(store: Storage, n: int) -> tuple[str, int, float]:
    """Ingest a sweep of about ``n`` points: job id, shards, seconds until all were enqueued."""
    name = f"scale/{n}-{time.time_ns()}/job.yaml"
    store.blob(names.INCOMING, name).upload_blob(manifest(n))
    settings = Settings(max_shards=max(n * 2, 1000))
    t = time.perf_counter()
    out = Ingestor(store, settings).ingest(name)
    secs = time.perf_counter() - t
    assert out.status == "accepted", out
    return out.job_id, out.shards, secs


def timed(fn, repeat: int = 5) -> list[float]:
    """The wall times of ``repeat`` calls."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


def reads(store: Storage, job_id: str) -> dict:
    """Status and the dashboard's job view, five times each: the median, and every time (``*_runs_s``)."""
    status = timed(lambda: job_status(store, job_id))
    api = JobAPI(store, Settings(), Caller("function_key", "bench", None))  # automation: every project
    detail = timed(lambda: dashboard.job_detail(api, job_id))
    return {"status_s": statistics.median(status), "status_runs_s": status,
            "dashboard_job_s": statistics.median(detail), "dashboard_job_runs_s": detail}


def report(store: Storage, job_id: str, shards: int, builds: int = REPORT_BUILDS) -> list[float]:
    """Give each shard a result, mark the job done, and time the report's build ``builds`` times (each a full
    rebuild, ``force``): the seconds of each. The first build in a process also imports the plotting and
    templating libraries, so the row takes the median."""
    ledger = Ledger(store)

    def result(i: int) -> None:
        sid = f"s{i:05d}"
        doc = {"shard_id": sid, "job_id": job_id, "status": "succeeded", "metrics": {"lyapunov": (i % 97) / 97},
               "timings": {"run_s": 0.01 + (i % 13) / 1000, "node_seconds": 0.01}}
        store.blob(names.RESULTS, f"{job_id}/{sid}.json").upload_blob(json.dumps(doc).encode(), overwrite=True)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(result, range(shards)))
    ledger.update_job(job_id, status=JobState.SUCCEEDED, shards_done=shards, shards_total=shards)
    secs = []
    for _ in range(builds):
        t = time.perf_counter()
        out = publish.publish(store, job_id, force=True)
        secs.append(time.perf_counter() - t)
        assert out.built, out
    return secs


def size(n: int, report_n: int) -> dict:
    """Every figure of one size, in a fresh in-memory Azurite."""
    with azurite.start_on_free_ports(Path(tempfile.mkdtemp()), in_memory=True) as az:
        store = Storage(az.connection_string)
        store.ensure()
        job_id, shards, secs = ingest(store, n)
        out = {"points": shards, "enqueued_s": secs, "per_shard_ms": 1000 * secs / shards, **reads(store, job_id)}
        small_job, _, _ = ingest(store, report_n) if report_n != shards else (job_id, 0, 0)
        builds = report(store, small_job, report_n)
        out.update(report_shards=report_n, report_s=statistics.median(builds), report_runs_s=builds)
        return out


def requests_in_child(n: int) -> dict:
    """``requests_per_shard(n)`` in a process of its own: the function app and the devhost hold their storage
    clients from the first run's environment, so a second sweep in one process would talk to a stopped
    Azurite. The child's figures are the last line of its stdout; its log lines pass through to stderr."""
    done = subprocess.run([sys.executable, __file__, "--requests-child", str(n)], check=True, stdout=subprocess.PIPE,
                          text=True, cwd=Path(__file__).resolve().parent.parent)
    return json.loads(done.stdout.strip().splitlines()[-1])


def requests_per_shard(n: int) -> dict:
    """The end-to-end request count of tests/faults/test_requests_per_shard.py, run here."""
    from tests.faults import harness
    from tests.faults.request_meter import RequestMeter
    from tests.faults.test_requests_per_shard import run_sweep

    root = Path(tempfile.mkdtemp())
    emulator = harness.start_azurite(root)
    try:
        env = harness.environment(root, emulator.connection_string, UPWELL_SCALE_SCHEDULE="*/30 * * * * *",
                                  UPWELL_POOLS=harness.pools(0))
        os.environ.update(env)
        stack = harness.Stack(root, emulator, env)
        stack.storage.ensure()
        meter = RequestMeter()
        run_sweep(stack, n, meter)
        return {"shards": n, **meter.per(n)}
    finally:
        emulator.stop()


def idle_requests(sizes: tuple[int, ...]) -> dict:
    """Requests per idle tick of each timer after each number of finished jobs (tests/faults/test_idle_reads.py)."""
    import pytest

    from tests.faults import harness
    from tests.faults.test_idle_reads import idle_costs, per_minute, pools, seed_finished

    root = Path(tempfile.mkdtemp())
    emulator = harness.start_azurite(root)
    patch = pytest.MonkeyPatch()
    try:
        env = harness.environment(root, emulator.connection_string, UPWELL_POOLS=pools())
        harness.apply_env(patch, env)
        storage = harness.Stack(root, emulator, env).storage
        storage.ensure()
        out = {}
        for n in sizes:
            seed_finished(storage, n)
            counts = {k: m.total for k, m in idle_costs(storage).items()}
            out[str(n)] = {**counts, "per_minute": round(per_minute(counts), 1)}
        return out
    finally:
        patch.undo()
        emulator.stop()


def sizes(text: str) -> tuple[int, ...]:
    """``--requests``: ``0`` (skip), or shard counts separated by commas, each at least 1."""
    try:
        out = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected shard counts separated by commas, got {text!r}") from None
    if out == (0,):
        return ()
    if any(n < 1 for n in out):
        raise argparse.ArgumentTypeError(f"shard counts must be at least 1, got {text!r}")
    return out


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--requests-child":
        print(json.dumps(requests_per_shard(int(sys.argv[2]))), flush=True)
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", type=int, default=1000)
    p.add_argument("--big", type=int, default=100_000)
    p.add_argument("--report-small", type=int, default=1000)
    p.add_argument("--report-big", type=int, default=10_000)
    p.add_argument("--requests", type=sizes, default=(50, 100),
                   help="shards of the end-to-end request count at two sizes, the small one first (0: skip)")
    p.add_argument("--idle-small", type=int, default=10, help="finished jobs before the first idle count (0: skip)")
    p.add_argument("--idle-big", type=int, default=200, help="finished jobs before the second idle count")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    figures = {"small": size(args.small, args.report_small), "big": size(args.big, args.report_big)}
    print(json.dumps(figures, indent=1), flush=True)
    if args.requests:
        figures["requests"] = {str(n): requests_in_child(n) for n in args.requests}
        print(json.dumps(figures["requests"], indent=1))
    if args.idle_small:
        figures["idle"] = idle_requests((args.idle_small, args.idle_big))
        print(json.dumps(figures["idle"], indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
