"""A block of grid points (``WorkItem.points``, upwell.ingest.blocks): its points run in turn, each through the
same launcher as a one-point item, with a checkpoint between them.

Each point runs as a work item of its own parameters (the block's ``params`` with the point's values over them)
in its own work dir ``W/p<j>/``; its outputs go to ``results/<job>/<shard>/p<j>/`` as it ends, and its log is
appended to the block's ``payload.log``. After each point the block's state, ``block.json`` (which points ended,
how, and their outputs), is uploaded as the shard's checkpoint (one blob write), so an attempt that follows a
preemption, a cancel or a lost node resumes at the next point not yet succeeded and never runs a succeeded one
again. A point preempted part-way keeps its own checkpoint beside it (``point/``), and resumes from it.

Failures, as a researcher of a sweep expects them (the same as a point per item, point by point):
- a point that fails is recorded failed (exit code, error, the tail of its log) and the block goes on to the
  next point;
- the block's attempt then fails like a one-point shard's: the message comes back after the backoff and the next
  attempt runs only the points not yet succeeded, until the shard's failures reach ``maxDequeueCount``; then the
  block is poisoned and its result lists every point, succeeded ones with their outputs;
- a point that exits 65 (unusable input), or runs past ``max_shard_wall_clock_s`` (which applies to each point),
  is not run again; a block whose only failures are such points fails at once, as a one-point shard would
  (permanent).
The block's one result document carries ``points``: one entry per point (``point_entry``), which
``upwell.results.points`` expands into point rows for the report and the views.

Cancel and lease: the launcher ticks (lease renewal, cancel check) inside a point that runs longer than a tick;
between short points the block ticks itself at most once a tick, so a cancel still reaches it within a tick and
a point, and a block of millisecond points renews its lease once a tick, not once a point.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from upwell.messages import WorkItem
from upwell.timeutil import now_iso
from workers.launch import run_payload
from workers.payload_process import TICK_S
from workers.workdir import LaunchResult, read_json

STATE = "block.json"  # in the block's checkpoint: the points that ended, and how
POINT = "point"  # in the block's checkpoint: a point's own checkpoint, when it was stopped part-way
LOG_TAIL = 2000  # characters of a failed point's log kept in the result


def launcher(item: WorkItem, staging) -> Callable[..., LaunchResult]:
    """What runs ``item``: the launcher itself for one point, the block runner (saving through ``staging``,
    ``workers.staging.Staging``) for a block."""
    if not item.points:
        return run_payload
    return functools.partial(run_block, save=functools.partial(staging.save_file, item),
                             stage_out=staging.stage_out)


def point_item(item: WorkItem, j: int) -> WorkItem:
    """Point ``j`` of a block as a one-point work item: its own params and outputs prefix."""
    return dataclasses.replace(item, params={**item.params, **item.points[j]}, points=[],
                               result_prefix=f"{item.result_prefix}/p{j}")


def run_block(item: WorkItem, workdir: Path, *, save: Callable[[Path], Any], stage_out: Callable[..., dict],
              input_path: Path | None = None, resume_dir: Path | None = None, stop=None,
              on_tick: Callable[[], None] | None = None, run_one: Callable[..., LaunchResult] = run_payload,
              tick_s: float = TICK_S, **launch: Any) -> LaunchResult:
    """Run the block's points not yet succeeded, in order; one LaunchResult for the block (``points``: each
    point's entry). ``save(path)`` stores a file of the block's checkpoint folder as the shard's checkpoint;
    ``stage_out(item, artifacts, out_dir)`` uploads a point's outputs. ``launch``: the launcher's keywords."""
    run = _Block(item, Path(workdir), resume_dir, stop, on_tick, tick_s)
    for j in range(len(item.points)):
        ended = run.state.get(str(j), {})
        if ended.get("status") == "succeeded" or ended.get("permanent"):
            continue
        if run.stopping():
            return run.result("preempted")
        one, started = point_item(item, j), now_iso()
        r = run_one(one, run.root / f"p{j}", input_path=input_path, resume_dir=run.point_resume(j), stop=stop,
                    on_tick=on_tick, **launch)
        run.ran(r)
        if r.status == "preempted":
            run.keep_point(j, r)
            return run.result("preempted")
        outputs = stage_out(one, r.artifacts, r.checkpoint_dir.parent / "out") if r.status == "succeeded" else {}
        run.ended(j, point_entry(one, j, r, outputs, started))
        save(run.write_state())
    failed = [e for e in run.state.values() if e.get("status") != "succeeded"]
    return run.result("failed" if failed else "succeeded", permanent=bool(failed) and all(
        e.get("permanent") for e in failed))


def point_entry(one: WorkItem, j: int, r: LaunchResult, outputs: dict[str, str], started: str) -> dict[str, Any]:
    """What the block's result records of point ``j`` (its parameters, outcome, metrics, outputs, times)."""
    failed = r.status != "succeeded"
    return {"point": j, "params": one.params, "status": "succeeded" if not failed else "failed",
            "exit_code": r.exit_code, "metrics": r.metrics, "artifacts": outputs, "run_s": r.run_s,
            "cpu_s": r.cpu_s, "max_rss_mb": r.max_rss_mb, "attempt": one.attempt,
            "permanent": r.permanent or r.timed_out,  # as a one-point shard's: not tried again
            "started": started, "finished": now_iso(), "timed_out": r.timed_out,
            "error": (f"exit code {r.exit_code}" + (" (timed out)" if r.timed_out else "")) if failed else "",
            "log_tail": _tail(r.log_path) if failed else ""}


class _Block:
    """One attempt of a block. State: its work dir, the checkpoint folder ``W/ckpt/`` (``block.json`` and a
    stopped point's own checkpoint), the points' entries, the log and what the attempt's points measured."""

    def __init__(self, item: WorkItem, root: Path, resume_dir: Path | None, stop, on_tick, tick_s: float):
        self.item, self.root, self.stop, self.on_tick, self.tick_s = item, root, stop, on_tick, tick_s
        self.ckpt, self.log = root / "ckpt", root / "payload.log"
        self.ckpt.mkdir(parents=True, exist_ok=True)
        if resume_dir is not None and Path(resume_dir).is_dir():
            shutil.copytree(resume_dir, self.ckpt, dirs_exist_ok=True)
        kept = read_json(self.ckpt / STATE)  # read once: the points that ended and the one stopped part-way
        self.state: dict[str, dict] = kept.get("points") or {}
        self.current = kept.get("current")
        self.resumed = sum(1 for e in self.state.values() if e.get("status") == "succeeded")
        self.runs: list[LaunchResult] = []
        self.saves, self.last_tick = 0, time.monotonic()

    def stopping(self) -> bool:
        """Stop before the next point? Ticks (lease, cancel) when a tick has passed since the last."""
        if self.on_tick is not None and time.monotonic() - self.last_tick >= self.tick_s:
            self.on_tick()
            self.last_tick = time.monotonic()
        return self.stop is not None and self.stop.is_set()

    def point_resume(self, j: int) -> Path | None:
        """The point's own checkpoint, when it was the one stopped part-way."""
        kept = self.ckpt / POINT
        return kept if self.current == j and kept.is_dir() else None

    def ran(self, r: LaunchResult) -> None:
        self.runs.append(r)
        if r.log_path is not None and Path(r.log_path).is_file():
            with open(self.log, "ab") as out, open(r.log_path, "rb") as src:
                shutil.copyfileobj(src, out)
        if r.run_s >= self.tick_s:  # a point that ran a tick or longer ticked inside the launcher
            self.last_tick = time.monotonic()

    def keep_point(self, j: int, r: LaunchResult) -> None:
        """A point stopped part-way: its own checkpoint goes beside the block's state."""
        kept = self.ckpt / POINT
        shutil.rmtree(kept, ignore_errors=True)
        if r.checkpoint_dir is not None and Path(r.checkpoint_dir).is_dir():
            shutil.copytree(r.checkpoint_dir, kept)
        self.write_state(current=j)

    def ended(self, j: int, entry: dict[str, Any]) -> None:
        self.state[str(j)] = entry
        shutil.rmtree(self.ckpt / POINT, ignore_errors=True)
        self.saves += 1

    def write_state(self, current: int | None = None) -> Path:
        path = self.ckpt / STATE
        path.write_text(json.dumps({"schema": 1, "shard_id": self.item.shard_id, "points": self.state,
                                    "current": current}, sort_keys=True, default=str))
        return path

    def result(self, status: str, permanent: bool = False) -> LaunchResult:
        """The block's LaunchResult: the last point's provenance, the attempt's usage summed, every entry."""
        runs, failed = self.runs, [e for e in self.state.values() if e.get("status") != "succeeded"]
        last = runs[-1] if runs else None
        entries = [self.state[str(j)] for j in range(len(self.item.points)) if str(j) in self.state]
        done = sum(1 for e in entries if e.get("status") == "succeeded")
        out = LaunchResult(
            status=status, exit_code=(failed[0].get("exit_code") if failed and status == "failed" else
                                      0 if status == "succeeded" else getattr(last, "exit_code", None)),
            metrics={"points": len(self.item.points), "points_succeeded": done, "points_failed": len(failed)},
            artifacts=[], checkpoint_dir=self.ckpt, checkpoints=self.saves,
            resumed_from=f"{self.resumed} of {len(self.item.points)} points done" if self.resumed else None,
            stderr_tail="\n".join(f"point p{e['point']}: {e.get('error')}\n{e.get('log_tail', '')[-500:]}"
                                  for e in failed)[-4000:],
            run_s=round(sum(r.run_s for r in runs), 3), log_path=self.log if self.log.is_file() else None,
            log_bytes=None if any(r.log_bytes is None for r in runs) else sum(r.log_bytes for r in runs),
            permanent=permanent,  # a point past its wall clock is that point's failure, not the block's
            definition=dict(getattr(last, "definition", None) or {}),
            cpu_wait_s=sum(r.cpu_wait_s for r in runs))
        out.cpu_s = sum(r.cpu_s or 0.0 for r in runs) if runs else None
        out.max_rss_mb = max((r.max_rss_mb or 0.0 for r in runs), default=None)
        out.points = entries
        return out


def _tail(path: Path | None) -> str:
    """The end of a point's log."""
    if path is None or not Path(path).is_file():
        return ""
    with open(path, "rb") as fh:
        fh.seek(max(0, Path(path).stat().st_size - LOG_TAIL))
        return fh.read().decode(errors="replace")
