"""Training throughput through the payload launcher against a bare PyTorch loop, in interleaved pairs; prints ratios.

The payload (``train-torch`` via ``workers.launch.run_payload``: its own process, a checkpoint of model,
optimizer and RNG states written in the background, an evaluation after the last epoch (``eval_every``), a
stop-flag check per step) and a bare in-process loop train the same model on the same data with the same
batches. Three ratios, each the median of the per-pair ratios (``bench/pairs.py``):

- step:  samples/s over optimizer steps only (the payload's ``samples_per_second``);
- loop:  samples/s over the whole epoch loop, so checkpoints and evaluation count;
- wall:  samples/s over the launcher's wall time, process start and imports included, over the bare loop.

Why the figures hold from run to run: both sides run with the same number of torch threads (``--threads``,
passed to the payload as ``OMP_NUM_THREADS``; 1 by default, because two OpenMP threads on a two-core machine
shared with anything else wait on each other at every step, and an epoch then took 0.06 s or 7 s); each
sample is ``--epochs`` epochs, 2–3 s of training on one quiet core, not the 0.6 s loop that read 0.97 in one
run and 0.84 in the next; both sides train in a fresh process, each started with setsid (``bare_process``),
after an untimed one-epoch run of each (the imports and data read from disk); and the two sides alternate,
pair by pair.

    .venv/bin/python bench/bench_train.py [--epochs 50] [--pairs 3] [--threads 1] [--arch cnn] [--batch-size 64]
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.pairs import interleave, pair_ratios
from upwell.messages import WorkItem
from upwell.payloads.models import TrainParams
from workers.launch import run_payload
from workers.payloads.train import Dist, batches, build_model, build_optimizer, load_data

FIGURES = ("step", "loop")


def bare(p: TrainParams) -> dict:
    """The loop with nothing around it: no process, no checkpoints, no evaluation."""
    import torch.nn.functional as F

    Xtr, ytr, _, _ = load_data(p.arch)
    model, d = build_model(p), Dist()
    opt = build_optimizer(p, model)
    samples, step_s = 0, 0.0
    started = time.perf_counter()
    for epoch in range(p.epochs):
        for idx in batches(len(Xtr), p, epoch, d):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(Xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
            step_s += time.perf_counter() - t0
            samples += len(idx)
    loop_s = time.perf_counter() - started
    return {"samples": samples, "step": samples / step_s, "loop": samples / loop_s, "loop_s": loop_s}


def bare_process(p: TrainParams) -> dict:
    """``bare`` in a process of its own started with setsid, as the launcher starts the payload
    (``start_new_session``): with the kernel's autogroup scheduling, each setsid group is one scheduling group
    with one fair share of the CPUs, so a bare loop in the bench's own group ran 2.5 times slower than the
    payload beside it on a busy machine. Like
    the payload, the child starts cold: its first steps' lazy set-up counts on both sides alike."""
    proc = subprocess.run([sys.executable, __file__, "--bare-child", p.model_dump_json()], capture_output=True,
                          text=True, start_new_session=True, env=os.environ.copy())
    if proc.returncode != 0:
        raise SystemExit(f"bare loop failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _bare_child(params: str) -> None:
    print(json.dumps(bare(TrainParams.model_validate_json(params))))


def payload(p: TrainParams) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        item = WorkItem(job_id="bench", shard_id="train", payload="train-torch", pool="gpu", params=p.model_dump())
        result = run_payload(item, Path(tmp) / "w")
    if result.status != "succeeded":
        raise SystemExit(f"train-torch {result.status}: {result.stderr_tail}")
    m = result.metrics
    n = m["samples_trained"]
    return {"samples": n, "step": m["samples_per_second"], "loop": n / m["loop_s"], "wall": n / result.run_s,
            "loop_s": m["loop_s"], "checkpoints": result.checkpoints, "checkpoint_s": m["checkpoint_s"],
            "test_accuracy": m["test_accuracy"]}


def ratios(runs_b: list[dict], runs_p: list[dict]) -> tuple[dict, dict]:
    """Per-pair ratios and their medians: step, loop, wall (over the bare loop) and ``own``, each side's loop
    over its own optimizer steps (what the payload adds around its steps)."""
    per = {k: pair_ratios([r[k] for r in runs_p], [r[k] for r in runs_b]) for k in FIGURES}
    per["wall"] = pair_ratios([r["wall"] for r in runs_p], [r["loop"] for r in runs_b])
    per["own"] = pair_ratios([r["loop"] / r["step"] for r in runs_p], [r["loop"] / r["step"] for r in runs_b])
    return per, {k: statistics.median(v) for k, v in per.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=50, help="epochs per sample (2-3 s of training)")
    parser.add_argument("--arch", default="cnn", choices=["cnn", "mlp"])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--pairs", type=int, default=3, help="bare/payload pairs; the median pair ratio is kept")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on both sides")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--bare-child", metavar="PARAMS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_child:
        return _bare_child(args.bare_child)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # read by torch in both children; the launcher keeps it
    p = TrainParams(epochs=args.epochs, arch=args.arch, batch_size=args.batch_size)
    warm = p.model_copy(update={"epochs": 1})
    bare_process(warm), payload(warm)  # untimed warm-up: the imports and the data read from disk once
    runs_b, runs_p = interleave(lambda: bare_process(p), lambda: payload(p), args.pairs)
    per, med = ratios(runs_b, runs_p)
    b = {k: statistics.median(r[k] for r in runs_b) for k in (*FIGURES, "loop_s")}
    q = {k: statistics.median(r[k] for r in runs_p) for k in (*FIGURES, "wall")}
    last = runs_p[-1]
    print(f"setup      {args.arch}, batch {args.batch_size}, {args.epochs} epochs, {last['samples']:.0f} samples, "
          f"{args.threads} threads, {args.pairs} interleaved pairs, bare loop {b['loop_s']:.2f} s (median)")
    print(f"bare       step {b['step']:,.0f} samples/s, loop {b['loop']:,.0f} samples/s (medians)")
    print(f"payload    step {q['step']:,.0f} samples/s, loop {q['loop']:,.0f} samples/s, wall {q['wall']:,.0f} "
          f"samples/s ({last['checkpoints']} checkpoints, {last['checkpoint_s']:.3f} s writing them; "
          f"test accuracy {last['test_accuracy']:.3f})")
    print("ratio      payload / bare, median of pairs: " + ", ".join(f"{k} {v:.3f}" for k, v in med.items()))
    print("pairs      loop " + " ".join(f"{x:.3f}" for x in per["loop"]))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"bare": runs_b, "payload": runs_p, "ratios": med, "pair_ratios": per,
                                         "threads": args.threads, "epochs": args.epochs}, indent=1))


if __name__ == "__main__":
    main()
