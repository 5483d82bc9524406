"""What every payload process shares: its context, the stop flag, checkpoints, metrics, exit codes.

A payload is started as ``python -m workers.payloads.<name> --workdir W`` (under
mpiexec or torchrun when it has ranks) by ``workers.launch.run_payload``. The
contract it keeps is written down in ``workers/payloads/README.md``:

- read ``W/item.json`` (``load_context``);
- resume from ``W/ckpt/`` when a checkpoint is there, write new ones atomically
  (``save_checkpoint``), which also bumps ``W/ckpt/progress.json``;
- write outputs under ``W/out/`` and its metrics to ``W/out/metrics.json``;
- exit 0 when done, 75 when stopped by SIGTERM/SIGUSR1 after checkpointing
  (``preempted``), 65 for input it cannot use (retrying will not help), else 1.

Only rank 0 of a multi-rank payload writes files.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from upwell.payloads.builtin import EXIT_BAD_INPUT, EXIT_OK, EXIT_PREEMPTED

EXIT_FAILED = 1

ITEM_FILE = "item.json"
PROGRESS_FILE = "progress.json"
METRICS_FILE = "metrics.json"
EXIT_FILE = "exit.json"

# Both mean "checkpoint and stop": Open MPI's mpiexec tears a job down within a
# second of SIGTERM, but forwards SIGUSR1 untouched, so the launcher sends that.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

__all__ = ["EXIT_OK", "EXIT_PREEMPTED", "EXIT_FAILED", "EXIT_BAD_INPUT", "BadInput", "Context",
           "StopFlag", "load_context", "install_stop_handler", "atomic_write_bytes", "atomic_write_json",
           "atomic_write", "save_checkpoint", "read_progress", "write_metrics", "mark_preempted",
           "run_main", "jsonable"]


class BadInput(Exception):
    """The shard's input or parameters cannot be used; the payload exits 65."""


@dataclass(frozen=True)
class Context:
    """The payload's view of its work item, read once from ``item.json``."""

    workdir: Path
    item: dict[str, Any]

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.item.get("params") or {})

    @property
    def attempt(self) -> int:
        return int(self.item.get("attempt", 1))

    @property
    def ranks(self) -> int:
        return int(self.item.get("ranks", 1))

    @property
    def input_path(self) -> Path | None:
        value = self.item.get("input_path")
        return Path(value) if value else None

    @property
    def ckpt_dir(self) -> Path:
        return self.workdir / "ckpt"

    @property
    def out_dir(self) -> Path:
        return self.workdir / "out"

    def require_input(self) -> Path:
        path = self.input_path
        if path is None or not path.is_file():
            raise BadInput(f"input_path {path} is missing or not a file")
        return path


def load_context(argv: list[str] | None = None) -> Context:
    parser = argparse.ArgumentParser(description="an upwell payload process")
    parser.add_argument("--workdir", required=True, type=Path)
    args = parser.parse_args(argv)
    workdir = args.workdir.resolve()
    item = json.loads((workdir / ITEM_FILE).read_text())
    return Context(workdir=workdir, item=item)


class StopFlag:
    """Set by SIGTERM or SIGUSR1; the payload polls it between steps (handlers stay tiny)."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def __bool__(self) -> bool:
        return self.signum is not None

    def is_set(self) -> bool:
        return self.signum is not None

    def _handle(self, signum: int, _frame: Any) -> None:
        self.signum = signum


def install_stop_handler() -> StopFlag:
    flag = StopFlag()
    for signum in STOP_SIGNALS:
        signal.signal(signum, flag._handle)
    return flag


def atomic_write(path: Path, writer: Callable[[Any], None], *, binary: bool = True) -> None:
    """Write through ``writer(file)`` into a temp file beside ``path``, fsync, then rename.

    A reader (or a restart after a kill) sees the old file or the new one, never half of one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb" if binary else "w") as handle:
            writer(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda handle: handle.write(data))


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, json.dumps(jsonable(obj), indent=1, allow_nan=False).encode())


def jsonable(obj: Any) -> Any:
    """Plain JSON: numpy scalars and arrays become numbers and lists; NaN and inf become None."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if hasattr(obj, "tolist") and not isinstance(obj, str | bytes):
        return jsonable(obj.tolist())
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def read_progress(ckpt_dir: Path) -> dict[str, Any] | None:
    """The latest checkpoint's progress record, or None when there is none (or it is unreadable)."""
    try:
        data = json.loads((Path(ckpt_dir) / PROGRESS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def save_checkpoint(ctx: Context, filename: str, writer: Callable[[Any], None], *, marker: Any,
                    unit: str) -> int:
    """Write ``ckpt/<filename>`` atomically, then ``ckpt/progress.json``; return the running count.

    The state file is written first: if the process dies between the two, the state
    is newer than the record, never older, and the state carries its own marker.
    """
    atomic_write(ctx.ckpt_dir / filename, writer)
    previous = read_progress(ctx.ckpt_dir) or {}
    count = int(previous.get("count", 0)) + 1
    atomic_write_json(ctx.ckpt_dir / PROGRESS_FILE, {
        "file": filename, "marker": marker, "unit": unit, "count": count,
        "attempt": ctx.attempt, "written_at": time.time()})
    return count


def write_metrics(ctx: Context, metrics: dict[str, Any]) -> None:
    atomic_write_json(ctx.out_dir / METRICS_FILE, metrics)


def mark_preempted(ctx: Context, marker: Any) -> None:
    """Record that this attempt stopped on request after checkpointing at ``marker``.

    The launcher reads it when a wrapper (torchrun) rewrites the exit code 75.
    """
    atomic_write_json(ctx.workdir / EXIT_FILE, {"status": "preempted", "marker": marker,
                                                "attempt": ctx.attempt, "at": time.time()})


def run_main(body: Callable[[Context], int]) -> None:
    """Run a payload's body and exit with its code; BadInput exits 65 with a one-line reason."""
    ctx = load_context()
    try:
        code = body(ctx)
    except BadInput as exc:
        print(f"bad input: {exc}", file=sys.stderr, flush=True)
        code = EXIT_BAD_INPUT
    sys.stdout.flush()
    sys.exit(code)
