"""Training throughput through the payload launcher against a bare PyTorch loop, same run; prints ratios.

The payload (``train-torch`` via ``workers.launch.run_payload``: its own process, a
checkpoint of model, optimizer and RNG states every epoch written in the background,
an evaluation after the last epoch (``eval_every``), a stop-flag check per step) and a
bare in-process loop train the same model on the same data with the same batches and
thread count. Three ratios:

- step:  samples/s over optimizer steps only (the payload's ``samples_per_second``);
- loop:  samples/s over the whole epoch loop, so checkpoints and evaluation count;
- wall:  samples/s over the launcher's wall time, process start and imports included.

    .venv/bin/python bench/bench_train.py [--epochs 10] [--arch cnn] [--batch-size 64] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from upwell.messages import WorkItem
from upwell.payloads.models import TrainParams
from workers.launch import run_payload
from workers.payloads.train import Dist, batches, build_model, build_optimizer, load_data


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
    return {"samples": samples, "step": samples / step_s, "loop": samples / loop_s}


def payload(p: TrainParams) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        item = WorkItem(job_id="bench", shard_id="train", payload="train-torch", pool="gpu", params=p.model_dump())
        result = run_payload(item, Path(tmp) / "w")
    if result.status != "succeeded":
        raise SystemExit(f"train-torch {result.status}: {result.stderr_tail}")
    m = result.metrics
    n = m["samples_trained"]
    return {"samples": n, "step": m["samples_per_second"], "loop": n / m["loop_s"], "wall": n / result.run_s,
            "checkpoints": result.checkpoints,
            "checkpoint_s": m["checkpoint_s"], "test_accuracy": m["test_accuracy"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--arch", default="cnn", choices=["cnn", "mlp"])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each; the best is kept")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import torch

    threads = max(1, os.cpu_count() or 1)  # what the launcher gives a one-rank payload
    torch.set_num_threads(threads)
    p = TrainParams(epochs=args.epochs, arch=args.arch, batch_size=args.batch_size)
    runs_b, runs_p = [], []
    for _ in range(args.repeat):  # interleaved, so a busy moment on a shared machine hits both alike
        runs_b.append(bare(p))
        runs_p.append(payload(p))
    b = {k: max(r[k] for r in runs_b) for k in ("step", "loop")}
    q = {k: max(r[k] for r in runs_p) for k in ("step", "loop", "wall")}
    last = runs_p[-1]
    print(f"setup      {args.arch}, batch {args.batch_size}, {args.epochs} epochs, {last['samples']:.0f} samples, "
          f"{threads} threads, best of {args.repeat}")
    print(f"bare       step {b['step']:,.0f} samples/s, loop {b['loop']:,.0f} samples/s")
    print(f"payload    step {q['step']:,.0f} samples/s, loop {q['loop']:,.0f} samples/s, "
          f"wall {q['wall']:,.0f} samples/s "
          f"({last['checkpoints']} checkpoints, {last['checkpoint_s']:.3f} s writing them; "
          f"test accuracy {last['test_accuracy']:.3f})")
    ratios = {"step": q["step"] / b["step"], "loop": q["loop"] / b["loop"], "wall": q["wall"] / b["loop"]}
    print(f"ratio      payload / bare: step {ratios['step']:.3f}, loop {ratios['loop']:.3f}, "
          f"wall {ratios['wall']:.3f} (wall over the bare loop)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"bare": runs_b, "payload": runs_p, "ratios": ratios}, indent=1))


if __name__ == "__main__":
    main()
