"""Run every benchmark in bench/ and print one table of their ratios.

Each ``bench_*.py`` runs in its own process with ``--json bench/out/<name>.json``; its
own output and any log lines go to ``bench/out/<name>.log`` (structlog is silenced with
``UPWELL_LOG_LEVEL=error``), so the terminal shows only the table. The table, the
machine load and every figure are also written to ``bench/out/summary.json``.

    .venv/bin/python bench/run_all.py [--only pipeline,heat] [--repeat 3] [--out bench/out]

With ``--repeat k`` each bench but those in ONCE runs k times; each row shows the median ratio and the
spread of the k ratios, (max − min) ÷ median (a row of seconds: of its seconds). Two runs on a quiet machine
should agree within 5% (``bench.pairs.STABLE``): a row over it is marked ``!`` and listed under the table.
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

from bench import rows  # noqa: E402


def load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


ONCE = {"scale"}  # minutes a run, and its rows are counts and growth ratios: run once


def run_one(script: Path, out: Path, tag: str = "") -> tuple[int, float]:
    name = script.stem.removeprefix("bench_") + tag
    env = {**os.environ, "UPWELL_LOG_LEVEL": "error", "PYTHONUNBUFFERED": "1"}
    started = time.perf_counter()
    with open(out / f"{name}.log", "w") as log:
        rc = subprocess.run([sys.executable, str(script), "--json", str(out / f"{name}.json")], cwd=HERE.parent,
                            stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    return rc, time.perf_counter() - started


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated bench names (pipeline, heat, train, scaling, ...)")
    ap.add_argument("--out", type=Path, default=HERE / "out")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each bench (not those run once: scale)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    only = {s for s in args.only.split(",") if s}
    scripts = [s for s in sorted(HERE.glob("bench_*.py")) if not only or s.stem.removeprefix("bench_") in only]
    load_before = load()
    status: dict[str, dict] = {}
    table = []
    for script in scripts:
        name = script.stem.removeprefix("bench_")
        runs = []
        for k in range(1 if name in ONCE else max(1, args.repeat)):
            print(f"running {name} ({k + 1}) ...", end="\r", file=sys.stderr, flush=True)
            tag = f".{k + 1}" if k else ""
            rc, secs = run_one(script, args.out, tag)
            status[name + tag] = {"rc": rc, "seconds": round(secs, 1)}
            path = args.out / f"{name}{tag}.json"
            runs.append(rows.rows(name, json.loads(path.read_text()) if rc == 0 and path.exists() else None))
        table += rows.spread(runs) if len(runs) > 1 else runs[0]
    print(" " * 40, end="\r", file=sys.stderr, flush=True)
    summary = {"load_before": load_before, "load_after": load(), "time": time.strftime("%Y-%m-%d %H:%M:%S"),
               "benches": status, "table": table}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(rows.render(table, summary))
    failed = [n for n, s in status.items() if s["rc"] != 0]
    if failed:
        print(f"failed: {', '.join(failed)} (see {args.out}/<name>.log)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
