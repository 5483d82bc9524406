"""Heat stencil benchmarks, each against its baseline in the same run; prints ratios.

1. Memory bandwidth: the payload's 5-point update (strip-mined numpy) moves at least
   16 bytes per cell per step (read u, write u'). Its achieved GB/s on that count is
   divided by the GB/s of ``np.copyto`` on an array of the same size (also 16 B/cell).
   A plain whole-array numpy expression of the same update is shown for scale.
2. Ranks: cells/s of the heat-mpi payload on 2 ranks over 1 rank, same grid, both
   through ``workers.launch.run_payload`` (the metric excludes start-up and checkpoints).

    .venv/bin/python bench/bench_heat.py [--n 2048] [--steps 20] [--mpi-nx 1024] [--mpi-steps 300]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from upwell.messages import WorkItem
from workers.launch import run_payload
from workers.payloads.heat import kernel_name, make_scratch, stencil, stencil_numpy


def best_of(repeat: int, fn) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def naive(u: np.ndarray, v: np.ndarray, rx: float, ry: float) -> None:
    c = u[1:-1, 1:-1]
    v[1:-1, 1:-1] = c + rx * (u[:-2, 1:-1] + u[2:, 1:-1] - 2 * c) + ry * (u[1:-1, :-2] + u[1:-1, 2:] - 2 * c)


def bandwidth(n: int, steps: int, repeat: int) -> dict:
    rng = np.random.default_rng(0)
    u, v = rng.random((n + 2, n + 2)), np.zeros((n + 2, n + 2))
    a, b = rng.random((n, n)), np.empty((n, n))
    scratch = make_scratch(n)
    moved = 16.0 * n * n * steps  # bytes: one read and one write of every cell, per step

    def run_stencil() -> None:
        for _ in range(steps):
            stencil(u, v, 0.2, 0.2, scratch)

    def run_strips() -> None:
        for _ in range(steps):
            stencil_numpy(u, v, 0.2, 0.2, scratch)

    def run_naive() -> None:
        for _ in range(steps):
            naive(u, v, 0.2, 0.2)

    def run_copy() -> None:
        for _ in range(steps):
            np.copyto(b, a)

    gbs = {name: moved / best_of(repeat, fn) / 1e9
           for name, fn in (("copy", run_copy), ("stencil", run_stencil), ("strips", run_strips),
                            ("naive", run_naive))}
    return {"n": n, "steps": steps, "kernel": kernel_name(), "copy_GBps": gbs["copy"], "stencil_GBps": gbs["stencil"],
            "numpy_strips_GBps": gbs["strips"], "strips_over_copy": gbs["strips"] / gbs["copy"],
            "naive_GBps": gbs["naive"], "stencil_over_copy": gbs["stencil"] / gbs["copy"],
            "naive_over_copy": gbs["naive"] / gbs["copy"]}


def ranks(nx: int, steps: int) -> dict:
    h2 = (1.0 / (nx + 1)) ** 2
    params = {"nx": nx, "t_end": steps * 0.2 * h2, "cfl": 0.2, "checkpoint_every": 10**9}
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in (1, 2):
            item = WorkItem(job_id="bench", shard_id=f"r{n}", payload="heat-mpi", pool="mpi", params=params, ranks=n)
            result = run_payload(item, Path(tmp) / f"r{n}")
            if result.status != "succeeded":
                raise SystemExit(f"heat-mpi on {n} ranks {result.status}: {result.stderr_tail}")
            out[n] = result
        identical = _same_field(out[1], out[2])
    cps = {n: r.metrics["cells_per_second"] for n, r in out.items()}
    return {"nx": nx, "steps": out[1].metrics["steps"], "cells_per_second_1": cps[1], "cells_per_second_2": cps[2],
            "speedup_2_over_1": cps[2] / cps[1], "wall_s_1": out[1].run_s, "wall_s_2": out[2].run_s,
            "fields_identical": identical}


def _same_field(a, b) -> bool:
    fields = []
    for result in (a, b):
        with np.load(result.checkpoint_dir.parent / "out" / "field.npz") as f:
            fields.append(np.array(f["u"]))
    return bool(np.array_equal(*fields))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2048, help="grid side for the bandwidth test")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--mpi-nx", type=int, default=1024)
    parser.add_argument("--mpi-steps", type=int, default=300)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    bw = bandwidth(args.n, args.steps, args.repeat)
    print(f"bandwidth  {bw['n']}x{bw['n']}, {bw['steps']} steps: copy {bw['copy_GBps']:.2f} GB/s, "
          f"stencil ({bw['kernel']}) {bw['stencil_GBps']:.2f} GB/s, numpy strips {bw['numpy_strips_GBps']:.2f} GB/s, "
          f"whole-array numpy {bw['naive_GBps']:.2f} GB/s")
    print(f"ratio      stencil / numpy copy = {bw['stencil_over_copy']:.3f}   "
          f"(whole-array numpy / copy = {bw['naive_over_copy']:.3f})")
    rk = ranks(args.mpi_nx, args.mpi_steps)
    print(f"ranks      {rk['nx']}x{rk['nx']}, {rk['steps']} steps: 1 rank {rk['cells_per_second_1']:.3g} cells/s, "
          f"2 ranks {rk['cells_per_second_2']:.3g} cells/s (wall {rk['wall_s_1']:.1f} s / {rk['wall_s_2']:.1f} s); "
          f"fields bit-identical: {rk['fields_identical']}")
    print(f"ratio      2 ranks / 1 rank = {rk['speedup_2_over_1']:.3f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"bandwidth": bw, "ranks": rk}, indent=1))


if __name__ == "__main__":
    main()
