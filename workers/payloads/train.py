"""A small conv net (or MLP) on scikit-learn's 8x8 handwritten digits, with exact resume.

Data: ``sklearn.datasets.load_digits`` (ships with scikit-learn, 1797 images),
split once into 75 % train / 25 % test with a fixed seed, stratified. Under
torchrun with several processes it trains with DistributedDataParallel (gloo on
CPU, nccl on CUDA; the device is chosen automatically): every rank walks the
same per-epoch permutation and takes its own slice of each global batch.
More ranks on a node than it has GPUs share them over gloo (``placement``).

Checkpoints (``ckpt/state.pt``) hold the model, the optimizer, every rank's RNG
states (torch, numpy, python), the epoch, the batch within it, the epoch's
running sums and the history, written atomically at each epoch end and when a
stop request arrives (after the current step; the ranks agree by allreduce).
Resuming therefore reproduces the uninterrupted run's metrics on CPU.

Outputs: ``out/model.pt`` and metrics (see the README).
"""

from __future__ import annotations

import io
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from upwell.payloads.models import TrainParams
from workers.payloads.common import (
    EXIT_OK,
    EXIT_PREEMPTED,
    Context,
    atomic_write,
    install_stop_handler,
    mark_preempted,
    read_progress,
    run_main,
    save_checkpoint,
    write_metrics,
)

STATE_FILE = "state.pt"
SPLIT_SEED = 0


@dataclass
class Dist:
    """Where this process sits: rank, world size and device (torchrun sets RANK/WORLD_SIZE/LOCAL_RANK)."""

    rank: int = 0
    world: int = 1
    device: Any = None
    backend: str = ""
    gpus: int = 0  # GPUs this process sees (CUDA_VISIBLE_DEVICES)

    @classmethod
    def start(cls) -> Dist:
        import torch

        world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
        local_rank, local_world = int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        shown = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        own = own_instance(shown, local_rank)
        if own:  # before CUDA starts in this process: it reads the list once
            os.environ["CUDA_VISIBLE_DEVICES"] = own
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        device = torch.device(f"cuda:{local_rank % gpus}" if gpus else "cpu")
        if gpus:
            torch.cuda.set_device(device)
        backend = ""
        if world > 1:
            import torch.distributed as dist

            backend = placement(gpus, local_world, mig=any(g.startswith("MIG-") for g in _ids(shown)))
            dist.init_process_group(backend, init_method="env://")
        return cls(rank, world, device, backend, gpus)

    def sum(self, values: list[float]) -> list[float]:
        if self.world == 1:
            return values
        import torch
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()

    def gather(self, obj: Any) -> list[Any]:
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out


def _ids(visible: str) -> list[str]:
    return [g.strip() for g in visible.split(",") if g.strip()]


def own_instance(visible: str, local_rank: int) -> str | None:
    """The device that local rank ``local_rank`` keeps of the shard's where any of them is a MIG instance
    (``workers.gpus`` names those by UUID), or None where the shard was given whole GPUs only, or one device. A
    CUDA process enumerates a single MIG instance however many it is shown, so ranks shown several would all land
    on the first: each rank keeps one device of its own, round robin (an instance, or a whole GPU of a node
    whose other GPUs are partitioned), and the ranks talk over gloo (``placement``, the same test)."""
    ids = _ids(visible)
    if len(ids) < 2 or not any(g.startswith("MIG-") for g in ids):
        return None
    return ids[local_rank % len(ids)]


def placement(gpus: int, local_ranks: int, mig: bool = False) -> str:
    """The process group's backend for ``local_ranks`` ranks on a node with ``gpus`` visible GPUs. nccl needs a
    GPU of its own for each rank (it refuses two ranks on one device), so ranks beyond the node's GPUs share
    them round robin (rank i on GPU i mod gpus) and talk over gloo, which reduces CUDA tensors too; no GPU:
    gloo on the CPU. MIG instances (``mig``): gloo, as NCCL does not run on them (it maps one rank to one
    PCI device; NVIDIA/nccl issue 1716)."""
    return "nccl" if gpus and local_ranks <= gpus and not mig else "gloo"


@dataclass
class State:
    """Progress through training; ``sums`` are this rank's (loss, correct, seen) for the current epoch."""

    epoch: int = 0
    batch: int = 0
    sums: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    history: dict[str, list[float]] = field(default_factory=lambda: {"loss": [], "accuracy": [], "test_epoch": [],
                                                                     "test_accuracy": [], "test_loss": []})

    @property
    def marker(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batch": self.batch}


def load_data(arch: str):
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, random_state=SPLIT_SEED, stratify=y)
    mean, std = Xtr.mean(), Xtr.std()  # one scale for all pixels, from the training split only
    Xtr, Xte = ((Xtr - mean) / std).astype(np.float32), ((Xte - mean) / std).astype(np.float32)
    shape = (-1, 1, 8, 8) if arch == "cnn" else (-1, 64)
    return (torch.from_numpy(Xtr).reshape(shape), torch.from_numpy(ytr).long(),
            torch.from_numpy(Xte).reshape(shape), torch.from_numpy(yte).long())


def build_model(p: TrainParams):
    import torch
    from torch import nn

    torch.manual_seed(p.seed)
    if p.arch == "mlp":
        return nn.Sequential(nn.Linear(64, p.hidden), nn.ReLU(), nn.Linear(p.hidden, 10))
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 4 * 4, p.hidden), nn.ReLU(),
                         nn.Linear(p.hidden, 10))


def build_optimizer(p: TrainParams, model):
    import torch

    if p.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=p.lr)
    return torch.optim.SGD(model.parameters(), lr=p.lr, momentum=p.momentum)


def batches(n: int, p: TrainParams, epoch: int, d: Dist) -> list:
    """This rank's index tensors for every global batch of ``epoch`` (same permutation on all ranks)."""
    import torch

    g = torch.Generator().manual_seed(p.seed * 1_000_003 + epoch)
    perm = torch.randperm(n, generator=g)
    # a global batch smaller than the world would leave a rank out of DDP's allreduce: drop it
    return [perm[i : i + p.batch_size][d.rank :: d.world] for i in range(0, n, p.batch_size)
            if len(perm[i : i + p.batch_size]) >= d.world]


def rng_state() -> dict[str, Any]:
    import torch

    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(state: dict[str, Any]) -> None:
    import torch

    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def snapshot(d: Dist, model, opt, st: State) -> bytes | None:
    """Gather every rank's RNG state and running sums; rank 0 gets ckpt/state.pt's bytes. Collective."""
    import torch

    per_rank = d.gather({"rng": rng_state(), "sums": list(st.sums)})
    if d.rank != 0:
        return None
    doc = {"model": _unwrap(model).state_dict(), "optimizer": opt.state_dict(), "epoch": st.epoch,
           "batch": st.batch, "history": st.history, "ranks": per_rank, "world": d.world}
    buffer = io.BytesIO()
    torch.save(doc, buffer)
    return buffer.getvalue()


class Writer:
    """Writes checkpoints in a background thread, one at a time and in order, while training goes on.

    ``wait()`` returns once every checkpoint handed over is on disk (state file, then progress record)."""

    def __init__(self, ctx: Context) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.ctx = ctx
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self.pending = None

    def put(self, data: bytes, marker: dict) -> None:
        self.wait()
        self.pending = self.pool.submit(save_checkpoint, self.ctx, STATE_FILE, lambda h: h.write(data),
                                        marker=marker, unit="epoch")

    def wait(self) -> None:
        if self.pending is not None:
            self.pending.result()
            self.pending = None


def restore(ctx: Context, d: Dist, model, opt) -> tuple[State, dict | None]:
    """Load ckpt/state.pt if there is one (every rank reads it); returns the state and its marker."""
    import torch

    path = ctx.ckpt_dir / STATE_FILE
    if not path.exists():
        torch.manual_seed(ctx.params.get("seed", 0) + 7919 * d.rank)
        return State(), None
    doc = torch.load(path, map_location="cpu", weights_only=False)
    _unwrap(model).load_state_dict(doc["model"])
    opt.load_state_dict(doc["optimizer"])
    mine = doc["ranks"][d.rank] if doc["world"] == d.world else doc["ranks"][0]
    set_rng_state(mine["rng"])
    if doc["world"] == d.world:
        sums = list(mine["sums"])
    else:  # a different rank count: rank 0 carries the epoch's running totals
        sums = [float(sum(r["sums"][k] for r in doc["ranks"])) if d.rank == 0 else 0.0 for k in range(3)]
    st = State(epoch=doc["epoch"], batch=doc["batch"], sums=sums, history=doc["history"])
    return st, st.marker


def _unwrap(model):
    return getattr(model, "module", model)


def evaluate(model, X, y) -> tuple[float, float]:
    import torch
    import torch.nn.functional as F

    with torch.no_grad():
        logits = model(X)
        return float(F.cross_entropy(logits, y)), float((logits.argmax(1) == y).float().mean())


@dataclass
class Clock:
    """This attempt's accounting: optimizer-step time and samples, checkpoint time (the loop's share:
    the snapshot, and waiting for the writer), the loop's wall time; and the checkpoint writer."""

    train_s: float = 0.0
    samples: int = 0
    written: int = 0
    checkpoint_s: float = 0.0
    loop_s: float = 0.0
    writer: Writer | None = None
    saved_at: float = field(default_factory=time.monotonic)  # the last checkpoint, or the start of this attempt

    def save(self, ctx: Context, d: Dist, model, opt, st: State, *, wait: bool = False) -> None:
        started = time.perf_counter()
        data = snapshot(d, model, opt, st)
        if data is not None:
            self.writer = self.writer or Writer(ctx)
            self.writer.put(data, st.marker)
            self.written += 1
        self.saved_at = time.monotonic()
        if wait:
            self.flush()
        self.checkpoint_s += time.perf_counter() - started

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.wait()


def train_epoch(ctx, d: Dist, p: TrainParams, model, opt, st: State, data, stop, clock: Clock) -> bool:
    """Run the rest of ``st.epoch``; return False when the ranks agreed to stop (checkpoint written)."""
    import torch.nn.functional as F

    Xtr, ytr = data[0], data[1]
    plan = batches(len(Xtr), p, st.epoch, d)
    while st.batch < len(plan):
        if d.sum([1.0 if stop else 0.0])[0] > 0:
            clock.save(ctx, d, model, opt, st, wait=True)
            return False
        started = time.perf_counter()
        idx = plan[st.batch]
        xb, yb = Xtr[idx].to(d.device), ytr[idx].to(d.device)
        opt.zero_grad(set_to_none=True)
        logits = model(xb)
        loss = F.cross_entropy(logits, yb)
        loss.backward()
        opt.step()
        st.sums[0] += loss.item() * len(idx)
        st.sums[1] += float((logits.argmax(1) == yb).sum())
        st.sums[2] += len(idx)
        st.batch += 1
        clock.train_s += time.perf_counter() - started
        clock.samples += len(idx)
    return True


def end_epoch(ctx, d: Dist, p: TrainParams, model, opt, st: State, data, clock: Clock) -> None:
    """Record the epoch; evaluate and checkpoint at the cadence the parameters ask for (and after the last)."""
    loss_sum, correct, seen = d.sum(st.sums)
    st.history["loss"].append(loss_sum / seen)
    st.history["accuracy"].append(correct / seen)
    epoch, last = st.epoch + 1, st.epoch + 1 == p.epochs
    if last or (p.eval_every and epoch % p.eval_every == 0):
        test_loss, test_acc = evaluate(_unwrap(model), data[2].to(d.device), data[3].to(d.device))
        st.history.setdefault("test_epoch", []).append(epoch)
        st.history["test_loss"].append(test_loss)
        st.history["test_accuracy"].append(test_acc)
    st.epoch, st.batch, st.sums = epoch, 0, [0.0, 0.0, 0.0]
    if last or (epoch % p.checkpoint_every == 0 and _interval_passed(d, p, clock)):
        clock.save(ctx, d, model, opt, st)


def _interval_passed(d: Dist, p: TrainParams, clock: Clock) -> bool:
    """checkpoint_interval_s since the last checkpoint, on any rank (the ranks agree: one allreduce)."""
    if not p.checkpoint_interval_s:
        return True
    due = time.monotonic() - clock.saved_at >= p.checkpoint_interval_s
    return d.sum([1.0 if due else 0.0])[0] > 0


def setup(ctx: Context, d: Dist, p: TrainParams):
    import torch

    if d.device.type == "cuda":  # CPU kernels used here are deterministic already; this costs ~1 s to set
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    model = build_model(p).to(d.device)
    opt = build_optimizer(p, model)
    st, resumed = restore(ctx, d, model, opt)
    if d.world > 1:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model, device_ids=[d.device.index] if d.device.type == "cuda" else None)
    return model, opt, st, resumed


def metrics(ctx: Context, d: Dist, p: TrainParams, model, st: State, clock: Clock, resumed, done: bool) -> dict:
    samples = d.sum([float(clock.samples)])[0]
    h = st.history
    return {"completed": done, "epochs": p.epochs, "epoch": st.epoch, "loss": h["loss"], "accuracy": h["accuracy"],
            "test_accuracy_history": h["test_accuracy"], "test_loss_history": h["test_loss"],
            "test_epochs": h.get("test_epoch", []),
            "test_accuracy": h["test_accuracy"][-1] if h["test_accuracy"] else None,
            "test_loss": h["test_loss"][-1] if h["test_loss"] else None,
            "samples_per_second": samples / clock.train_s if clock.train_s > 0 else None, "train_s": clock.train_s,
            "loop_s": clock.loop_s, "checkpoint_s": clock.checkpoint_s, "samples_trained": samples,
            "device": str(d.device), "backend": d.backend or None, "gpus_visible": d.gpus, "world_size": d.world,
            "arch": p.arch,
            "parameters": sum(x.numel() for x in _unwrap(model).parameters()),
            "checkpoints_written": clock.written,
            "checkpoints_total": (read_progress(ctx.ckpt_dir) or {}).get("count", 0),
            "resumed_from": resumed, "resumed_from_epoch": resumed["epoch"] if resumed else None,
            "attempt": ctx.attempt}


def main(ctx: Context) -> int:
    import torch

    stop = install_stop_handler()
    p = TrainParams(**ctx.params)
    d = Dist.start()
    data = load_data(p.arch)
    model, opt, st, resumed = setup(ctx, d, p)
    clock = Clock()
    done, started = True, time.perf_counter()
    while st.epoch < p.epochs:
        if not train_epoch(ctx, d, p, model, opt, st, data, stop, clock):
            done = False
            break
        end_epoch(ctx, d, p, model, opt, st, data, clock)
    clock.flush()
    clock.loop_s = time.perf_counter() - started
    m = metrics(ctx, d, p, model, st, clock, resumed, done)
    if d.rank == 0:
        if done:
            atomic_write(ctx.out_dir / "model.pt", lambda h: torch.save(_unwrap(model).state_dict(), h))
        else:
            mark_preempted(ctx, st.marker)
        write_metrics(ctx, m)
    if d.world > 1:
        torch.distributed.destroy_process_group()
    return EXIT_OK if done else EXIT_PREEMPTED


if __name__ == "__main__":
    run_main(main)
