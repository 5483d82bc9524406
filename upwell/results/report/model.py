"""One view per shard: the ledger's shard row (a typed ShardRow) and the shard's result document, merged.

The ledger and the result writers are separate; either side may be missing, late
or partial, so the result document is read defensively (the row was coerced once,
by ShardRow.from_entity). Times become aware UTC datetimes. An attempt history
(``history``: a list, or a JSON string, of ``{node, started, finished, status}``)
on the shard row or in the result's ``timings`` lets the timeline draw earlier,
preempted attempts.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from upwell import names
from upwell.cost import to_float, truthy
from upwell.rows import ShardRow

FAILED = frozenset({"failed", "poisoned", "poison", "error"})
TERMINAL = FAILED | {"succeeded"}
MAX_TEXT = 200  # a scalar string longer than this is not a table cell
EARLIER = "(earlier attempts)"  # timeline row for attempts whose node was not recorded


@dataclass
class Attempt:
    node: str
    started: datetime
    finished: datetime | None
    status: str


@dataclass
class ShardView:
    shard_id: str
    status: str = "unknown"
    payload: str = ""
    pool: str = ""
    node: str = ""
    vm_size: str = ""
    price_key: str = ""
    spot: bool = False
    attempts: int = 0
    preemptions: int = 0
    checkpoints: int = 0
    resumed_from: Any = None
    fresh_start: str = ""  # a checkpoint dropped for a fresh start, and why (workers.checkpoints)
    queued: datetime | None = None
    started: datetime | None = None
    finished: datetime | None = None
    queue_wait_s: float | None = None
    run_s: float | None = None
    node_seconds: float | None = None  # paid: the last attempt + preempted + failed attempts
    node_seconds_from: str = ""  # where the last attempt's figure came from: "ledger" | "result" | "run time" | ""
    preempted_node_seconds: float = 0.0
    failed_node_seconds: float = 0.0
    cpu_wait_s: float = 0.0  # time waited for a CPU other local workers held: not in node_seconds
    first_started: datetime | None = None
    params: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)  # the whole metrics document
    error: str = ""
    stderr_tail: str = ""
    poisoned: bool = False
    has_result: bool = False
    provenance: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)  # the result's timings, as written
    history: list[Attempt] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.status in FAILED

    def scalar_metrics(self) -> dict[str, Any]:
        return {k: v for k, v in self.metrics.items() if is_scalar(v)}

    def attempts_drawn(self) -> list[Attempt]:
        """Attempts for the timeline: the recorded history, then the last attempt unless it is in there.

        Without a history, earlier attempts (preempted or retried) are drawn as one bar
        from the first start, on a row of their own: their nodes were not recorded.
        """
        out = list(self.history)
        earlier_s = self.preempted_node_seconds + self.failed_node_seconds
        if not out and earlier_s > 0 and self.first_started and self.started and self.first_started < self.started:
            end = min(self.first_started + timedelta(seconds=earlier_s), self.started)
            out.append(Attempt(EARLIER, self.first_started, end,
                               "preempted" if self.preempted_node_seconds else "retried"))
        if self.started is not None and all(a.started != self.started for a in out):
            out.append(Attempt(self.node, self.started, self.finished, self.status))
        return out


def parse_ts(value: Any) -> datetime | None:
    """ISO 8601 text, a datetime or epoch seconds, as an aware UTC datetime; None if unreadable."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return datetime.fromtimestamp(float(value), UTC)
        except (OverflowError, OSError, ValueError):
            return None
    try:
        out = datetime.fromisoformat(str(value).strip())
    except ValueError:
        return None
    return out if out.tzinfo else out.replace(tzinfo=UTC)


def iso(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z") if value else None


def is_scalar(value: Any) -> bool:
    if isinstance(value, bool | int):
        return True
    if isinstance(value, float):
        return True
    return isinstance(value, str) and len(value) <= MAX_TEXT


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def as_dict(value: Any) -> dict:
    """A dict from a dict or a JSON object string; {} otherwise."""
    if isinstance(value, dict):
        return value
    if isinstance(value, str | bytes) and value:
        try:
            out = json.loads(value)
        except ValueError:
            return {}
        return out if isinstance(out, dict) else {}
    return {}


def as_list(value: Any) -> list:
    if isinstance(value, list):
        return value
    if isinstance(value, str) and value:
        try:
            out = json.loads(value)
        except ValueError:
            return []
        return out if isinstance(out, list) else []
    return []


def _int(value: Any) -> int:
    out = to_float(value)
    return int(out) if out is not None else 0


def _seconds(explicit: Any, start: datetime | None, end: datetime | None) -> float | None:
    value = to_float(explicit)
    if value is not None:
        return max(value, 0.0)
    if start and end:
        return max((end - start).total_seconds(), 0.0)
    return None


def _first_number(*candidates: tuple[Any, str]) -> tuple[float | None, str]:
    """The first candidate that reads as a number, and its label."""
    for value, label in candidates:
        out = to_float(value)
        if out is not None:
            return out, label
    return None, ""


def _history(raw: Any, default_node: str) -> list[Attempt]:
    out = []
    for item in as_list(raw):
        if not isinstance(item, dict):
            continue
        started = parse_ts(item.get("started") or item.get("started_at"))
        if started is None:
            continue
        out.append(Attempt(str(item.get("node") or default_node), started,
                           parse_ts(item.get("finished") or item.get("finished_at")),
                           str(item.get("status") or "unknown")))
    return out


def merge(shards: Iterable[ShardRow], results: list[dict]) -> list[ShardView]:
    """One ShardView per shard id seen in the ledger's shard rows or the result documents, in id order."""
    rows = {r.shard_id: r for r in shards or () if r.shard_id and r.shard_id != names.JOB_ROW}
    docs = {str(d.get("shard_id")): d for d in results if isinstance(d, dict) and d.get("shard_id")}
    return [view(sid, rows.get(sid), docs.get(sid)) for sid in sorted(set(rows) | set(docs), key=natural)]


def natural(text: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


def view(shard_id: str, row: ShardRow | None, doc: dict | None) -> ShardView:
    """A shard's row (None: the ledger has none) and its result document, merged. A zero the row type
    gives a field that was never written (node-seconds, counters) leaves the result's figure standing."""
    ledger = row if row is not None else ShardRow(shard_id=shard_id)
    doc = doc or {}
    timings = as_dict(doc.get("timings"))
    node = as_dict(doc.get("node"))
    status = ledger.status.value if row is not None else ""
    if doc and status not in TERMINAL:
        status = str(doc.get("status") or status).lower()
    queued = parse_ts(ledger.queued_at) or parse_ts(timings.get("queued"))
    started = parse_ts(timings.get("started")) or parse_ts(ledger.started_at)
    finished = parse_ts(timings.get("finished")) or parse_ts(ledger.finished_at)
    run_s = _seconds(timings.get("run_s"), started, finished)
    first_started = parse_ts(ledger.first_started_at) or started
    last_s, last_from = _first_number((ledger.node_seconds or None, "ledger"), (timings.get("node_seconds"), "result"),
                                      (run_s, "run time"))
    preempted_s = _first_number((ledger.preempted_node_seconds or None, ""),
                                (timings.get("preempted_node_seconds"), ""))[0]
    failed_s = _first_number((ledger.failed_node_seconds or None, ""), (timings.get("failed_node_seconds"), ""))[0]
    paid = None if last_s is None and not (preempted_s or failed_s) else (last_s or 0) + (preempted_s or 0) + (
        failed_s or 0)
    node_id = ledger.node or str(node.get("id") or "")
    return ShardView(
        shard_id=shard_id, status=status or "unknown", payload=str(doc.get("payload") or ""),
        pool=ledger.pool or str(doc.get("pool") or node.get("pool") or ""), node=node_id,
        vm_size=str(node.get("vm_size") or ""), price_key=ledger.price_key,
        spot=ledger.spot if row is not None else truthy(node.get("spot")),
        attempts=max(ledger.attempts, _int(timings.get("attempt"))),
        preemptions=max(ledger.preemptions, _int(timings.get("preemptions"))),
        checkpoints=max(ledger.checkpoints, _int(timings.get("checkpoints"))),
        resumed_from=timings.get("resumed_from"), fresh_start=str(timings.get("fresh_start") or ""),
        queued=queued, started=started, finished=finished,
        queue_wait_s=_seconds(timings.get("queue_wait_s"), queued, first_started), run_s=run_s,
        node_seconds=paid, node_seconds_from=last_from if last_s is not None else "",
        preempted_node_seconds=max(preempted_s or 0.0, 0.0), failed_node_seconds=max(failed_s or 0.0, 0.0),
        cpu_wait_s=max(to_float(timings.get("cpu_wait_s")) or 0.0, 0.0), first_started=first_started,
        params=ledger.parameters() or as_dict(doc.get("params")),
        metrics=as_dict(doc.get("metrics")),
        error=ledger.error or str(doc.get("error") or ""),
        stderr_tail=ledger.stderr_tail or str(doc.get("stderr_tail") or ""),
        poisoned=status in ("poisoned", "poison") or ledger.poisoned,
        has_result=bool(doc), provenance=as_dict(doc.get("provenance")), timings=timings,
        history=_history(ledger.attempts_history() or timings.get("history"), node_id),
    )
