"""Run every benchmark in bench/ and print one table of their ratios.

Each ``bench_*.py`` runs in its own process with ``--json bench/out/<name>.json``; its
own output and any log lines go to ``bench/out/<name>.log`` (structlog is silenced with
``UPWELL_LOG_LEVEL=error``), so the terminal shows only the table. The table, the
machine load and every figure are also written to ``bench/out/summary.json``.

    .venv/bin/python bench/run_all.py [--only pipeline,heat] [--out bench/out]
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


def run_one(script: Path, out: Path) -> tuple[int, float]:
    name = script.stem.removeprefix("bench_")
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
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    only = {s for s in args.only.split(",") if s}
    scripts = [s for s in sorted(HERE.glob("bench_*.py")) if not only or s.stem.removeprefix("bench_") in only]
    load_before = load()
    status: dict[str, dict] = {}
    for script in scripts:
        name = script.stem.removeprefix("bench_")
        print(f"running {name} ...", end="\r", file=sys.stderr, flush=True)
        rc, secs = run_one(script, args.out)
        status[name] = {"rc": rc, "seconds": round(secs, 1)}
    print(" " * 40, end="\r", file=sys.stderr, flush=True)
    table = []
    for name in status:
        path = args.out / f"{name}.json"
        figures = json.loads(path.read_text()) if status[name]["rc"] == 0 and path.exists() else None
        table += rows.rows(name, figures)
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
