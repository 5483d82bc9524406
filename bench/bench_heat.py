"""Heat stencil benchmarks, each against its baseline in interleaved pairs in the same run; prints ratios.

1. Memory bandwidth: the payload's 5-point update (the C kernel, or the strip-mined numpy where it is not
   built) moves at least 16 bytes per cell per step (read u, write u'). Its achieved GB/s on that count is
   divided by the GB/s of ``np.copyto`` from ``u`` to ``v``, the same two arrays (16 B/cell). Copy and kernel
   alternate in ``--pairs`` pairs (``bench/pairs.py``), each sample at least ``--sample-s`` seconds of steps
   after an untimed one (warm caches), timed on the thread's CPU clock (both are single-threaded). The ratio
   is that of each side's 90th-percentile sample (``pairs.high_ratio``); the median pair ratio is kept beside
   it. The grid is 8192² (two arrays of 537 MB), larger than the 480 MiB last-level cache this VM shares with
   its host's other tenants, so both sides stream from memory, as the grid of a real run does: at 2048² (67 MB,
   held in that cache) the copy's bandwidth moved with the tenants' use of the cache and the ratio read
   0.40-0.63 from run to run; at 8192² three runs read 0.601-0.612 (bench/README.md, 2026-12-04). The numpy
   strips and a plain whole-array numpy expression of the same update are shown for scale.
2. Ranks: cells/s of the heat-mpi payload on 2 ranks over 1 rank, same grid, both through
   ``workers.launch.run_payload`` (the metric excludes start-up and checkpoints), in ``--mpi-pairs``
   interleaved pairs, the median of the per-pair ratios.

    .venv/bin/python bench/bench_heat.py [--n 8192] [--pairs 41] [--sample-s 0.2] [--mpi-nx 1024] [--mpi-steps 300]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.pairs import calibrate, high_ratio, interleave, pair_ratios, quantile
from upwell.messages import WorkItem
from workers.launch import run_payload
from workers.payloads.heat import kernel_name, make_scratch, stencil, stencil_numpy


def timed(fn, reps: int, clock=time.perf_counter) -> float:
    """Seconds on ``clock`` for ``reps`` calls of ``fn``."""
    started = clock()
    for _ in range(reps):
        fn()
    return clock() - started


def naive(u: np.ndarray, v: np.ndarray, rx: float, ry: float) -> None:
    c = u[1:-1, 1:-1]
    v[1:-1, 1:-1] = c + rx * (u[:-2, 1:-1] + u[2:, 1:-1] - 2 * c) + ry * (u[1:-1, :-2] + u[1:-1, 2:] - 2 * c)


def rate(fn, nbytes: float, target_s: float) -> tuple[float, int, float]:
    """GB/s of ``fn`` (one step moving ``nbytes``) over a sample of at least ``target_s`` seconds of this
    thread's CPU time, after one untimed step (warm caches); the steps, and the sample's wall-clock GB/s.

    Both kernels are single-threaded, so the thread's CPU time is their running time, and time spent
    waiting for a core on a shared machine, which wall-clock GB/s would count, stays out of both sides."""
    timed(fn, 1)
    reps = calibrate(fn, target_s, time.thread_time)
    wall, cpu = time.perf_counter(), time.thread_time()
    timed(fn, reps)
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    return nbytes * reps / cpu / 1e9, reps, nbytes * reps / wall / 1e9


def bandwidth(n: int, pairs: int, target_s: float, steps: int) -> dict:
    """The kernel's GB/s over numpy's copy of the same arrays, in interleaved pairs (``bench/pairs.py``).

    Both read ``u`` and write ``v``, the same (n+2)² arrays, so both meet the same caches and pages; the copy
    moves 16 bytes for every cell of them, the kernel (at its minimum traffic) for every interior cell.
    The numpy strips and the whole-array expression are shown for scale, over ``steps`` steps each."""
    rng = np.random.default_rng(0)
    u, v = rng.random((n + 2, n + 2)), np.zeros((n + 2, n + 2))
    scratch = make_scratch(n)
    copy_bytes, cell_bytes = 16.0 * (n + 2) ** 2, 16.0 * n * n
    samples_copy, samples_stencil = interleave(
        lambda: rate(lambda: np.copyto(v, u), copy_bytes, target_s),
        lambda: rate(lambda: stencil(u, v, 0.2, 0.2, scratch), cell_bytes, target_s), pairs)
    copy, sten = [g for g, _, _ in samples_copy], [g for g, _, _ in samples_stencil]
    wall = pair_ratios([w for _, _, w in samples_stencil], [w for _, _, w in samples_copy])
    per = pair_ratios(sten, copy)
    strips = cell_bytes * steps / timed(lambda: stencil_numpy(u, v, 0.2, 0.2, scratch), steps) / 1e9
    whole = cell_bytes * steps / timed(lambda: naive(u, v, 0.2, 0.2), steps) / 1e9
    copy_m = statistics.median(copy)
    return {"n": n, "pairs": pairs, "sample_s": target_s, "kernel": kernel_name(), "copy_GBps": copy_m,
            "stencil_GBps": statistics.median(sten), "stencil_over_copy": high_ratio(sten, copy),
            "median_pair_ratio": statistics.median(per), "pair_ratios": per,
            "copy_high_GBps": quantile(copy, 0.9), "stencil_high_GBps": quantile(sten, 0.9),
            "wall_clock_ratio": statistics.median(wall), "copy_samples_GBps": copy, "stencil_samples_GBps": sten,
            "steps_per_sample": {"copy": samples_copy[0][1], "stencil": samples_stencil[0][1]},
            "numpy_strips_GBps": strips, "strips_over_copy": strips / copy_m, "naive_GBps": whole,
            "naive_over_copy": whole / copy_m}


def ranks(nx: int, steps: int, pairs: int) -> dict:
    """cells/s of heat-mpi on 2 ranks over 1 rank, in interleaved pairs; both fields of the first pair compared."""
    h2 = (1.0 / (nx + 1)) ** 2
    params = {"nx": nx, "t_end": steps * 0.2 * h2, "cfl": 0.2, "checkpoint_every": 10**9}
    with tempfile.TemporaryDirectory() as tmp:
        runs = iter(range(10**6))

        def run(n: int):
            k = next(runs)
            item = WorkItem(job_id="bench", shard_id=f"r{n}-{k}", payload="heat-mpi", pool="mpi", params=params,
                            ranks=n)
            result = run_payload(item, Path(tmp) / f"r{n}-{k}")
            if result.status != "succeeded":
                raise SystemExit(f"heat-mpi on {n} ranks {result.status}: {result.stderr_tail}")
            return result

        one, two = interleave(lambda: run(1), lambda: run(2), pairs)
        identical = _same_field(one[0], two[0])
    cps1, cps2 = ([r.metrics["cells_per_second"] for r in side] for side in (one, two))
    per = pair_ratios(cps2, cps1)
    return {"nx": nx, "steps": one[0].metrics["steps"], "pairs": pairs,
            "cells_per_second_1": statistics.median(cps1), "cells_per_second_2": statistics.median(cps2),
            "speedup_2_over_1": statistics.median(per), "pair_ratios": per,
            "wall_s_1": statistics.median(r.run_s for r in one), "wall_s_2": statistics.median(r.run_s for r in two),
            "fields_identical": identical}


def _same_field(a, b) -> bool:
    fields = []
    for result in (a, b):
        with np.load(result.checkpoint_dir.parent / "out" / "field.npz") as f:
            fields.append(np.array(f["u"]))
    return bool(np.array_equal(*fields))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=8192, help="grid side for the bandwidth test")
    parser.add_argument("--pairs", type=int, default=41,
                        help="copy/kernel pairs; the ratio of each side's 90th-percentile sample is kept")
    parser.add_argument("--sample-s", type=float, default=0.2, help="seconds of work in each sample (at least)")
    parser.add_argument("--steps", type=int, default=3, help="steps of the numpy variants shown for scale")
    parser.add_argument("--mpi-nx", type=int, default=1024)
    parser.add_argument("--mpi-steps", type=int, default=300)
    parser.add_argument("--mpi-pairs", type=int, default=3, help="1-rank/2-rank pairs")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    bw = bandwidth(args.n, args.pairs, args.sample_s, args.steps)
    print(f"bandwidth  {bw['n']}x{bw['n']}, {bw['pairs']} pairs of >= {bw['sample_s']:g} s "
          f"({bw['steps_per_sample']['copy']} copies, {bw['steps_per_sample']['stencil']} steps): "
          f"copy {bw['copy_GBps']:.2f} GB/s, "
          f"stencil ({bw['kernel']}) {bw['stencil_GBps']:.2f} GB/s, numpy strips {bw['numpy_strips_GBps']:.2f} GB/s, "
          f"whole-array numpy {bw['naive_GBps']:.2f} GB/s")
    pairs = " ".join(f"{x:.3f}" for x in bw["pair_ratios"])
    print(f"ratio      stencil / numpy copy = {bw['stencil_over_copy']:.3f} on CPU time (90th percentiles), "
          f"median of pairs {bw['median_pair_ratio']:.3f} ({pairs}); "
          f"on wall-clock time {bw['wall_clock_ratio']:.3f}   "
          f"(whole-array numpy / copy = {bw['naive_over_copy']:.3f})")
    rk = ranks(args.mpi_nx, args.mpi_steps, args.mpi_pairs)
    print(f"ranks      {rk['nx']}x{rk['nx']}, {rk['steps']} steps: 1 rank {rk['cells_per_second_1']:.3g} cells/s, "
          f"2 ranks {rk['cells_per_second_2']:.3g} cells/s (wall {rk['wall_s_1']:.1f} s / {rk['wall_s_2']:.1f} s); "
          f"fields bit-identical: {rk['fields_identical']}")
    print(f"ratio      2 ranks / 1 rank = {rk['speedup_2_over_1']:.3f}, median of pairs "
          f"{' '.join(f'{x:.3f}' for x in rk['pair_ratios'])}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"bandwidth": bw, "ranks": rk}, indent=1))


if __name__ == "__main__":
    main()
