"""Run the benchmarks of a plan (``bench/plan.py``) and print one table of their ratios.

Each ``bench_*.py`` runs in its own process with its plan's arguments and ``--json bench/out/<name>.json``;
its own output and any log lines, stdout and stderr, go to ``bench/out/<name>.log`` (structlog is silenced
with ``UPWELL_LOG_LEVEL=error``), so stdout shows only the table and stderr nothing (the progress line is
drawn only where stderr is a terminal). The table, the machine load, the plan, each bench's seconds and
every figure are also written to ``bench/out/summary.json``.

    .venv/bin/python bench/run_all.py [--plan default|scale] [--only pipeline,heat] [--repeat 3] [--out bench/out]

With ``--repeat k`` each bench whose plan step does not fix its runs runs k times; each row shows the median
ratio and the spread of the k ratios, (max − min) ÷ median (a row of seconds: of its seconds). A bench run
once (scale, drop, reconcile) shows the spread of its own repeats within the run where it has them. Two runs
on a quiet machine should agree within 5% (``bench.pairs.STABLE``): a row over it is marked ``!`` and listed
under the table. Before each bench run the machine itself is probed (``bench/probe.py``: a pure-Python loop, an
interpreter start, a memory copy); the last rows show how far each probe measure moved over the whole run, so
that a row over 5% can be told from a machine that moved.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench import plan, probe, rows  # noqa: E402


def load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def progress(text: str) -> None:
    """A progress line that the next one overwrites, only on a terminal: redirected, stderr stays empty."""
    if sys.stderr.isatty():
        print(f"{text:<60}", end="\r", file=sys.stderr, flush=True)


def run_one(step: plan.Step, out: Path, tag: str = "") -> tuple[int, float]:
    """Run one bench in its own process, its output to ``<out>/<name><tag>.log``: exit status and seconds."""
    name = step.bench + tag
    env = {**os.environ, "UPWELL_LOG_LEVEL": "error", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, str(HERE / f"bench_{step.bench}.py"), *step.args, "--json", str(out / f"{name}.json")]
    started = time.perf_counter()
    with open(out / f"{name}.log", "w") as log:
        rc = subprocess.run(command, cwd=HERE.parent, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    return rc, time.perf_counter() - started


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", default="default", choices=sorted(plan.PLANS),
                    help="default: every bench (make bench); scale: the scale benches at the issue's sizes")
    ap.add_argument("--only", default="", help="comma-separated bench names of the plan (pipeline, heat, ...)")
    ap.add_argument("--out", type=Path, default=HERE / "out")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each bench whose plan step does not fix them")
    args = ap.parse_args()
    try:
        steps = plan.steps(args.plan, {s for s in args.only.split(",") if s})
    except ValueError as e:
        ap.error(str(e))
    args.out.mkdir(parents=True, exist_ok=True)
    load_before, started = load(), time.perf_counter()
    status: dict[str, dict] = {}
    table, probes = [], []
    for step in steps:
        runs = []
        for k in range(plan.runs(step, args.repeat)):
            progress(f"running {step.bench} ({k + 1}) ...")
            tag = f".{k + 1}" if k else ""
            probes.append(probe.probe())
            rc, secs = run_one(step, args.out, tag)
            status[step.bench + tag] = {"rc": rc, "seconds": round(secs, 1), "args": list(step.args),
                                        "probe": probes[-1]}
            path = args.out / f"{step.bench}{tag}.json"
            runs.append(rows.rows(step.bench, json.loads(path.read_text()) if rc == 0 and path.exists() else None))
        table += rows.spread(runs) if len(runs) > 1 else runs[0]
    table += rows.machine(probes)
    progress("")
    summary = {"plan": args.plan, "repeat": args.repeat, "load_before": load_before, "load_after": load(),
               "time": time.strftime("%Y-%m-%d %H:%M:%S"), "seconds": round(time.perf_counter() - started),
               "benches": status, "table": table}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(rows.render(table, summary))
    failed = [n for n, s in status.items() if s["rc"] != 0]
    if failed:
        print(f"failed: {', '.join(failed)} (see {args.out}/<name>.log)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
