"""The training payload's GPU path, checked on a machine with CUDA (CI has none; the figures are in bench/README.md).

Each step goes through ``workers.launch.run_payload``, the agent's own launcher, with the built-in train-torch
definition, as the CPU tests in ``tests/integration/test_train.py`` do:

1. ``run``: the default configuration on one GPU: it ends succeeded, on ``cuda:0``, at the documented accuracy.
2. ``resume``: a run of 40 epochs stopped after its first checkpoint (SIGTERM from the launcher, as on a spot eviction),
   resumed from the copied checkpoint: the history must equal the uninterrupted run's. With
   ``torch.use_deterministic_algorithms`` the GPU's kernels are deterministic, so it is compared exactly.
3. ``to_cpu``: the same GPU checkpoint resumed where no GPU is visible (``CUDA_VISIBLE_DEVICES=""``), as when a
   re-queued shard lands on a CPU node: it must load (``map_location``) and finish at the accuracy.
4. ``ddp``: two ranks under torchrun on a node with fewer GPUs than ranks: they share the GPU over gloo
   (``workers.payloads.train.placement``), stop, and resume on one rank.
5. ``lease``: the agent's list of the node's GPUs (``workers.gpus``, from ``nvidia-smi``) is what torch sees,
   and the shard that asked for one GPU was given GPU 0 (``CUDA_VISIBLE_DEVICES``).
6. ``nccl``: the collectives the payload calls (``all_reduce`` of float64, ``all_gather_object``) on NCCL with
   one rank a GPU; and, noted rather than checked, whether NCCL takes two ranks on one GPU (the reason for step
   4's placement).

    python3 bench/gpu_check.py [--json out.json] [--allow-cpu]

Prints one line a check and exits 1 when any fails. ``--allow-cpu`` runs the same steps where there is no GPU
(to try the script itself; every device check then reads ``cpu``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from upwell.messages import WorkItem  # noqa: E402
from workers.gpus import node_gpus  # noqa: E402
from workers.launch import run_payload  # noqa: E402

LONG_EPOCHS = 40
HISTORY = ("loss", "accuracy", "test_accuracy_history", "test_loss_history", "test_accuracy", "test_loss")
NCCL_PROBE = r"""
import os, sys, torch, torch.distributed as dist
rank, world, gpu = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
torch.cuda.set_device(gpu)
dist.init_process_group("nccl", init_method="tcp://127.0.0.1:" + sys.argv[4], rank=rank, world_size=world)
t = torch.tensor([1.5, 2.0 + rank], dtype=torch.float64, device=f"cuda:{gpu}")
dist.all_reduce(t)
out = [None] * world
dist.all_gather_object(out, {"rank": rank})
torch.cuda.synchronize()
print("OK", t.tolist(), out, flush=True)
dist.destroy_process_group()
"""


def item(params: dict, *, ranks: int = 1, gpus: int = 1, attempt: int = 1) -> WorkItem:
    return WorkItem(job_id="gpu-check", shard_id="train", payload="train-torch", pool="gpu", params=params,
                    ranks=ranks, gpus=gpus, attempt=attempt)


def stop_after_checkpoint(workdir: Path) -> tuple[threading.Event, object]:
    stop = threading.Event()

    def tick() -> None:
        if (workdir / "ckpt" / "progress.json").exists():
            stop.set()

    return stop, tick


def history_gap(a: dict, b: dict) -> float:
    """The largest absolute difference between two runs' histories (inf where their lengths differ)."""
    gap = 0.0
    for key in HISTORY:
        x, y = a[key], b[key]
        x, y = (x, y) if isinstance(x, list) else ([x], [y])
        if len(x) != len(y):
            return float("inf")
        gap = max([gap, *(abs(float(p) - float(q)) for p, q in zip(x, y, strict=True))])
    return gap


def with_env(name: str, value: str | None):
    """Set (or, with None, remove) one environment variable; returns a function that puts it back."""
    old = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value

    def restore() -> None:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old

    return restore


class Checks:
    def __init__(self, want: str) -> None:
        self.want, self.rows, self.failed = want, [], 0

    def add(self, name: str, ok: bool, detail: str, **figures) -> None:
        self.failed += not ok
        self.rows.append({"check": name, "ok": bool(ok), "detail": detail, **figures})
        print(f"{'ok  ' if ok else 'FAIL'} {name:9} {detail}", flush=True)

    def note(self, name: str, detail: str, **figures) -> None:
        """An observation, not a check: what the machine did, kept beside the checks."""
        self.rows.append({"check": name, "ok": None, "detail": detail, **figures})
        print(f"note {name:9} {detail}", flush=True)


def run_checks(root: Path, checks: Checks) -> None:
    want = checks.want
    started = time.monotonic()
    full = run_payload(item({}), root / "full")
    m = full.metrics or {}
    checks.add("run", full.status == "succeeded" and m.get("device") == want and m.get("test_accuracy", 0) >= 0.95,
               f"{full.status} on {m.get('device')} (given GPUs {full.gpus}, visible {m.get('gpus_visible')}); "
               "test accuracy "
               f"{m.get('test_accuracy')}; {m.get('samples_per_second', 0) or 0:,.0f} samples/s; "
               f"{time.monotonic() - started:.1f} s in all", gpus=full.gpus, tail=full.stderr_tail[-2000:])

    # Long enough that the stop lands well before the end on a GPU, where an epoch takes milliseconds.
    long = {"epochs": LONG_EPOCHS}
    base = run_payload(item(long), root / "long")
    m = base.metrics or {}
    stop, tick = stop_after_checkpoint(root / "cut")
    cut = run_payload(item({**long, "checkpoint_interval_s": 0}), root / "cut", stop=stop, on_tick=tick, tick_s=0.02)
    saved = root / "saved"
    if cut.checkpoint_dir and Path(cut.checkpoint_dir).exists():
        shutil.copytree(cut.checkpoint_dir, saved)
    resumed = run_payload(item(long, attempt=2), root / "resumed", resume_dir=saved)
    rm = resumed.metrics or {}
    gap = history_gap(rm, m) if base.status == resumed.status == "succeeded" else float("inf")
    checks.add("resume", cut.status == "preempted" and resumed.status == "succeeded" and rm.get("device") == want
               and resumed.resumed_from is not None and gap == 0.0,
               f"cut {cut.status} at {cut.metrics and cut.metrics.get('epoch')}, resumed from "
               f"{resumed.resumed_from} on {rm.get('device')}: {resumed.status}; history gap {gap:g}",
               gap=gap, tail=(cut.stderr_tail + resumed.stderr_tail)[-2000:])

    restore = with_env("CUDA_VISIBLE_DEVICES", "")
    try:
        cpu = run_payload(item(long, attempt=2, gpus=0), root / "cpu", resume_dir=saved)
    finally:
        restore()
    cm = cpu.metrics or {}
    cpu_gap = history_gap(cm, m) if cpu.status == "succeeded" else float("inf")
    checks.add("to_cpu", cpu.status == "succeeded" and cm.get("device") == "cpu" and cm.get("test_accuracy", 0) >= 0.95
               and cpu.resumed_from is not None,
               f"the GPU checkpoint resumed on {cm.get('device')}: {cpu.status}; test accuracy "
               f"{cm.get('test_accuracy')}; history gap to the GPU run {cpu_gap:.2e}", gap=cpu_gap,
               tail=cpu.stderr_tail[-2000:])

    params = {"epochs": LONG_EPOCHS, "arch": "mlp", "checkpoint_interval_s": 0}
    stop, tick = stop_after_checkpoint(root / "ddp")
    ddp = run_payload(item(params, ranks=2), root / "ddp", stop=stop, on_tick=tick, tick_s=0.02)
    dm = ddp.metrics or {}
    one = run_payload(item(params, attempt=2), root / "ddp1", resume_dir=ddp.checkpoint_dir) \
        if ddp.status == "preempted" else None
    om = (one.metrics or {}) if one else {}
    checks.add("ddp", ddp.status == "preempted" and dm.get("world_size") == 2 and dm.get("device") == want
               and one is not None and one.status == "succeeded" and om.get("test_accuracy", 0) >= 0.95,
               f"2 ranks on {dm.get('device')} over {dm.get('backend')} (gpus visible {dm.get('gpus_visible')}): "
               f"{ddp.status}; resumed on 1 rank: {one and one.status}, test accuracy {om.get('test_accuracy')}",
               tail=(ddp.stderr_tail + (one.stderr_tail if one else ""))[-2000:])


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def nccl_world(gpus_of_ranks: list[int], timeout_s: float = 120) -> tuple[bool, str]:
    """Start one process a rank (rank i on GPU ``gpus_of_ranks[i]``) running ``NCCL_PROBE``; (all OK, output)."""
    port, world = free_port(), len(gpus_of_ranks)
    procs = [subprocess.Popen([sys.executable, "-c", NCCL_PROBE, str(r), str(world), str(g), port],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r, g in enumerate(gpus_of_ranks)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=timeout_s)[0])
        except subprocess.TimeoutExpired:
            p.kill()
            outs.append(p.communicate()[0] + "\n(timed out)")
    ok = all(p.returncode == 0 and "OK" in o for p, o in zip(procs, outs, strict=True))
    return ok, "\n".join(o.strip()[-600:] for o in outs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--allow-cpu", action="store_true")
    args = ap.parse_args()
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    env = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda, "gpus": gpus,
           "gpu": torch.cuda.get_device_name(0) if gpus else None,
           "nccl": ".".join(map(str, torch.cuda.nccl.version())) if gpus else None}
    print("environment:", json.dumps(env), flush=True)
    if not gpus and not args.allow_cpu:
        print("no GPU visible: nothing to check (--allow-cpu runs the steps on the CPU)", file=sys.stderr)
        return 2
    checks = Checks("cuda:0" if gpus else "cpu")
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        run_checks(Path(tmp), checks)
    if gpus:
        listed = node_gpus({})  # nvidia-smi's list, as an agent with no UPWELL_GPUS reads it
        given = [r.get("gpus") for r in checks.rows if r["check"] == "run"]
        mig = bool(listed) and listed[0].startswith("MIG-")  # torch sees one MIG instance, however many there are
        checks.add("lease", (mig or len(listed) == gpus) and given == [listed[:1]],
                   f"nvidia-smi lists {listed}, torch sees {gpus}; the shard asking for one was given {given}")
        ok, out = nccl_world([0])
        checks.add("nccl", ok, "one rank on GPU 0: all_reduce float64 and all_gather_object "
                   + ("ran" if ok else "FAILED"), tail=out)
        shared, out = nccl_world([0, 0])
        duplicate = "Duplicate GPU" in out or "duplicate GPU" in out
        checks.note("nccl_2on1", f"two ranks on GPU 0: {'ran' if shared else 'refused'}"
                    + (" (Duplicate GPU detected)" if duplicate else ""), shared=shared, tail=out)
    if args.json:
        args.json.write_text(json.dumps({"environment": env, "checks": checks.rows}, indent=2))
    counted = [r for r in checks.rows if r["ok"] is not None]
    print(f"{len(counted) - checks.failed} of {len(counted)} checks passed", flush=True)
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
