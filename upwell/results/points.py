"""A block's result and shard row as its grid points: the one expansion every reader of results uses (the report,
``upwell status``, the dashboard's job view), so that tables, plots and progress count points, not work items.

A shard of a job made with ``points_per_item: k`` (upwell.ingest.blocks) is a block: its row carries ``points``
(each point's own values over its ``params``), and its one result document (workers.blocks) carries ``points``:
one entry per point (its parameters, status, exit code, metrics, outputs, times, and the tail of a failed point's
log). ``expand`` turns each into one row and one document per point, shaped as a one-point shard's, with the id
``<shard>.p<j>``. The block's node time is shared among its points by their run times (by count where none was
measured). A one-point shard passes through unchanged.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from typing import Any

from upwell.rows import JobRow, ShardRow, ShardState

SHARED = ("node_seconds", "preempted_node_seconds", "failed_node_seconds", "cpu_wait_s")


def point_id(shard_id: str, j: int) -> str:
    """Point ``j`` of block ``shard_id``."""
    return f"{shard_id}.p{j}"


def block_of(shard_id: str) -> str:
    """The shard (block) that holds a point's id; a shard's own id for any other."""
    return shard_id.rsplit(".p", 1)[0] if ".p" in shard_id else shard_id


def failed_points(doc: dict) -> str | None:
    """A block result's failed points by index, comma-separated, for its shard row; None for a one-point result."""
    points = doc.get("points")
    if not isinstance(points, list) or not points:
        return None
    return ",".join(str(e.get("point")) for e in points if isinstance(e, dict) and e.get("status") != "succeeded")


def expand(rows: Iterable[ShardRow], results: Iterable[dict]) -> tuple[list[ShardRow], list[dict]]:
    """The job's shard rows and result documents with every block's expanded into its points."""
    docs: list[dict] = []
    by_block: dict[str, dict] = {}
    for doc in results:
        points = expand_result(doc)
        docs.extend(points)
        if len(points) > 1 or points[0] is not doc:
            by_block[str(doc.get("shard_id"))] = {p["point"]: p for p in points}
    out = [r for row in rows for r in expand_row(row, by_block.get(row.shard_id))]
    return out, docs


def expand_result(doc: dict) -> list[dict]:
    """A result document as its points' documents (a block's); any other as itself, in a list."""
    points = doc.get("points") if isinstance(doc, dict) else None
    if not isinstance(points, list) or not points:
        return [doc]
    entries = [e for e in points if isinstance(e, dict)]
    timings = doc.get("timings") if isinstance(doc.get("timings"), dict) else {}
    shares = _shares(entries)
    sid = str(doc.get("shard_id") or "")
    base = {k: v for k, v in doc.items() if k != "points"}
    return [{**base, "shard_id": point_id(sid, int(e.get("point", j))), "block": sid, "point": int(e.get("point", j)),
             "status": "succeeded" if e.get("status") == "succeeded" else "failed",
             "params": e.get("params") or {}, "metrics": e.get("metrics") or {}, "artifacts": e.get("artifacts") or {},
             "exit_code": e.get("exit_code"), "error": e.get("error") or "", "stderr_tail": e.get("log_tail") or "",
             "timings": _timings(timings, e, share)}
            for j, (e, share) in enumerate(zip(entries, shares, strict=True))]


def expand_row(row: ShardRow, points: dict[int, dict] | None = None) -> list[ShardRow]:
    """A shard row as its points' rows (a block's), each with the point's parameters and, where the block's
    result says, the point's own status and error; any other row as itself."""
    block = row.block()
    if not block:
        return [row]
    shared, n = row.parameters(), len(block)
    failed = {int(p) for p in row.points_failed.split(",") if p.isdigit()}
    out = []
    for j, own in enumerate(block):
        doc = (points or {}).get(j)
        status = ShardState(doc["status"]) if doc else _status(row, j, failed)
        out.append(dataclasses.replace(
            row, shard_id=point_id(row.shard_id, j), params=json.dumps({**shared, **own}, sort_keys=True), points="",
            status=status, error=(doc or {}).get("error", row.error if status == ShardState.FAILED else "") or "",
            node_seconds=row.node_seconds / n,
            preempted_node_seconds=row.preempted_node_seconds / n, failed_node_seconds=row.failed_node_seconds / n,
            cost_usd=row.cost_usd / n if row.cost_usd is not None else None))
    return out


def _status(row: ShardRow, j: int, failed: set[int]) -> ShardState:
    """Point ``j``'s state from its block's row alone: a failed block's points not among those collect recorded
    failed had succeeded; otherwise the block's state."""
    if row.status == ShardState.FAILED and failed:
        return ShardState.FAILED if j in failed else ShardState.SUCCEEDED
    return row.status


def progress(job: JobRow) -> dict[str, Any] | None:
    """Points done and total of a job of blocks, from its counters (no shard read); None for a point per shard.
    Blocks are counted whole (every block holds ``points_per_item`` points but the last), so ``done`` is exact
    once the job ends and within one block of it before."""
    k, total = int(job.points_per_item or 0), int(job.points_total or 0)
    if k <= 1 or not total:
        return None
    ended = job.shards_done + job.shards_failed
    done = total if ended >= job.shards_total else min(total, ended * k)
    return {"total": total, "done": done, "per_item": k}


def _shares(entries: list[dict]) -> list[float]:
    """Each point's share of the block's node time: by run time, else evenly."""
    runs = [max(float(e.get("run_s") or 0.0), 0.0) for e in entries]
    total = sum(runs)
    return [r / total for r in runs] if total > 0 else [1.0 / len(entries)] * len(entries)


def _timings(block: dict, entry: dict, share: float) -> dict:
    """A point's timings: its own start, end, run time and usage; its share of the block's node time."""
    out = {**block, **{k: float(block.get(k) or 0.0) * share for k in SHARED if k in block}}
    out.update({"started": entry.get("started") or block.get("started"),
                "finished": entry.get("finished") or block.get("finished"), "run_s": entry.get("run_s"),
                "cpu_s": entry.get("cpu_s"), "max_rss_mb": entry.get("max_rss_mb")})
    return out
