"""The report's shard table: which rows the HTML shows, and every row as ``shards.csv``.

A job of up to ``limit`` shards shows every shard, in shard id order. A bigger one shows a bounded table
(a page of 100,000 rows would take longer to render than the job to run, and no reader scrolls it): the
failed shards first, then the slowest, up to ``limit`` in all, again in shard id order. Every shard stays
in ``summary.json`` and in ``shards.csv`` (one row a shard: its status, node, attempts, times, cost, and a
column per parameter and scalar metric). Pure: rows in, rows or bytes out.
"""

from __future__ import annotations

import csv
import io
from typing import Any

FIXED = ("shard_id", "status", "node", "pool", "spot", "attempts", "preemptions", "queued_at", "started_at",
         "finished_at", "queue_wait_s", "run_s", "node_seconds", "cost_usd", "has_result")


def shown(rows: list[dict], limit: int) -> list[dict]:
    """The rows the HTML table shows: all of them up to ``limit``; else the failed, then the slowest."""
    if len(rows) <= limit:
        return rows
    failed = [r for r in rows if r.get("status") == "failed"][:limit]
    picked = {id(r) for r in failed}
    rest = sorted((r for r in rows if id(r) not in picked), key=lambda r: -_seconds(r.get("run_s")))
    chosen = failed + rest[:limit - len(failed)]
    return sorted(chosen, key=lambda r: str(r.get("shard_id", "")))


def _seconds(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value == value else -1.0


def to_csv(rows: list[dict]) -> bytes:
    """Every shard row as CSV: the fixed columns, then ``param.<name>`` and ``metric.<name>`` for each
    parameter and scalar metric any shard has, in first-seen order; an empty cell where a shard has none."""
    params: dict[str, None] = {}
    metrics: dict[str, None] = {}
    for r in rows:
        params.update(dict.fromkeys(r.get("params") or {}))
        metrics.update(dict.fromkeys(r.get("metrics") or {}))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*FIXED, *(f"param.{p}" for p in params), *(f"metric.{m}" for m in metrics)])
    for r in rows:
        p, m = r.get("params") or {}, r.get("metrics") or {}
        writer.writerow([_cell(r.get(k)) for k in FIXED] + [_cell(p.get(k)) for k in params]
                        + [_cell(m.get(k)) for k in metrics])
    return out.getvalue().encode("utf-8")


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return str(value)
