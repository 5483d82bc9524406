"""The node's GPUs, shared out among the shards that run on it at once.

On Azure Batch a container task is given every GPU of its node ("Batch will automatically enable GPU for
container tasks"), a VM Scale Set's agent runs with ``--gpus all``, and a Slurm job sees the GPUs of its
allocation. With several slots on one node (the pool's tasks per node), every shard would then find the same
first GPU and leave the others idle while they are billed. So a shard that asks for ``gpus: n`` is given n of
the node's GPUs of its own, through ``CUDA_VISIBLE_DEVICES``: the n that the fewest running shards hold (a
node asked for more than it has shares them rather than failing). A shard that asks for none is left as it
is: it sees what the node sees, as a payload that uses a GPU only when there is one expects.

The node's GPUs, in this order: ``UPWELL_GPUS`` ("0,1,2,3", or "none"), the ``CUDA_VISIBLE_DEVICES`` the
agent itself was given (Slurm's allocation), else the indices ``nvidia-smi`` lists; none where there is no
``nvidia-smi``. The ids are passed on as the agent's environment names them, so a subset stays valid there.

A GPU in MIG mode (A100, H100 and H200 nodes can be partitioned) is not a device CUDA can use by its index: its
instances are, each by its UUID (``MIG-...``, as ``nvidia-smi -L`` lists them under their GPU), so such a GPU
counts as its instances, and one with none made counts as nothing. ``mig.mode.current`` says which GPUs are
in MIG mode; where the driver does not know that field, none is.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

VISIBLE = "CUDA_VISIBLE_DEVICES"


def node_gpus(env: Mapping[str, str] | None = None) -> list[str]:
    """The ids of this node's GPUs (see the module docstring); [] for a node without one."""
    env = os.environ if env is None else env
    for name in ("UPWELL_GPUS", VISIBLE):
        if name in env:
            ids = [g.strip() for g in env[name].split(",") if g.strip()]
            return [] if ids in ([], ["none"], ["-1"]) else ids
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    out = _smi(smi, "--query-gpu=index,mig.mode.current", "--format=csv,noheader")
    if out is None:  # a driver older than MIG does not know the field
        out = _smi(smi, "--query-gpu=index", "--format=csv,noheader")
    rows = [[f.strip() for f in line.split(",")] for line in (out or "").splitlines() if line.strip()]
    mig = {row[0] for row in rows if row[1:2] == ["Enabled"]}
    instances = mig_instances(_smi(smi, "-L") or "") if mig else {}
    return [g for row in rows for g in (instances.get(row[0], []) if row[0] in mig else [row[0]])]


def mig_instances(listing: str) -> dict[str, list[str]]:
    """The MIG instances of each GPU, by the GPU's index, from ``nvidia-smi -L``::

        GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-9c73eb7b-...)
          MIG 1g.10gb     Device  0: (UUID: MIG-a686709d-...)
    """
    out: dict[str, list[str]] = {}
    gpu = None
    for line in listing.splitlines():
        if m := re.match(r"GPU (\d+):", line.strip()):
            gpu = m.group(1)
        elif (m := re.match(r"MIG .*\(UUID: (MIG-[^)\s]+)\)", line.strip())) and gpu is not None:
            out.setdefault(gpu, []).append(m.group(1))
    return out


def _smi(smi: str, *args: str) -> str | None:
    """``nvidia-smi``'s output; None where it fails (no driver loaded, a field it does not know)."""
    try:
        return subprocess.run([smi, *args], capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


class GpuPool:
    """The node's GPUs and how many running shards hold each. State: the count per id, under a lock (the
    agent's slots take and give back from their own threads)."""

    def __init__(self, ids: list[str]) -> None:
        self.ids = list(ids)
        self.held = dict.fromkeys(self.ids, 0)
        self._lock = threading.Lock()

    @contextmanager
    def lease(self, wanted: int) -> Iterator[list[str] | None]:
        """The GPUs a shard that asks for ``wanted`` runs on, held until it ends; None: leave its environment
        as it is (it asks for none, or the node has none)."""
        if wanted <= 0 or not self.ids:
            yield None
            return
        with self._lock:  # the least held first; among equals, the node's order
            chosen = sorted(self.ids, key=self.held.__getitem__)[:wanted]  # stable: equals keep node order
            for g in chosen:
                self.held[g] += 1
        try:
            yield chosen
        finally:
            with self._lock:
                for g in chosen:
                    self.held[g] -= 1


def visible(env: dict[str, str], chosen: list[str] | None) -> dict[str, str]:
    """``env`` with the shard's GPUs made the only ones its payload sees (unchanged for None). CUDA numbers
    devices fastest first unless told otherwise; ``nvidia-smi`` numbers them in PCI bus order, so the ids mean
    the same GPUs to both only with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (kept where the node sets its own)."""
    if chosen is not None:
        env[VISIBLE] = ",".join(chosen)
        env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    return env


_NODE: GpuPool | None = None
_NODE_LOCK = threading.Lock()


def node() -> GpuPool:
    """This process's pool of the node's GPUs, read once."""
    global _NODE
    with _NODE_LOCK:
        if _NODE is None:
            _NODE = GpuPool(node_gpus())
        return _NODE
