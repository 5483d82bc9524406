"""Accounting: what shards and jobs cost, from the node-seconds the shard rows record.

A shard costs its paid node-seconds (the last attempt, and preempted and failed ones) x the price of its
node (spot or pay-as-you-go) x its share of the node (``prices.node_share``). A gang's node-seconds already hold
its nodes: the agent records an attempt's time x the nodes it held (workers.results, workers.settle), and its
share is that of one node, so nothing here multiplies again. ``breakdown`` and ``actual``
price a report's shard rows (mappings, as the report reads them); ``rollup`` sums the ledger's shards per
job, owner or project for the jobs created since a date, beside their estimates and the estimate's error,
so `upwell cost` agrees with the per-shard figures in the reports.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from upwell.cost.prices import DEFAULT_KEY, PriceTable, load
from upwell.rows import JobRow, JobState, ShardRow

if TYPE_CHECKING:
    from upwell.ledger import Ledger

BY = ("job", "owner", "project")
FINISHED = (JobState.SUCCEEDED, JobState.PARTIALLY_FAILED, JobState.FAILED)  # jobs whose estimate is compared


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """'30d', '12h', '90m', '2w' or an ISO date -> an aware UTC datetime."""
    now = now or datetime.now(UTC)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([mhdw])\s*", text or "")
    if m:
        unit = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}[m[2]]
        return now - timedelta(**{unit: float(m[1])})
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"--since {text!r}: give a duration like 30d, 12h, 2w or an ISO date") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def ledger_time(when: datetime) -> str:
    """As the ledger writes times (upwell.timeutil.now_iso), so strings compare in time order."""
    return when.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def shard_cost(row: ShardRow, job: JobRow, table: PriceTable | None = None) -> float:
    key = row.price_key or job.price_key or DEFAULT_KEY
    usd = shard_usd(row.paid_seconds, key, row.spot, job.node_share or 1.0, prices=table)
    return float(usd or 0.0)


@dataclass
class Group:
    key: str
    jobs: int = 0
    shards: int = 0
    node_seconds: float = 0.0
    actual_usd: float = 0.0
    estimate_usd: float = 0.0
    estimated_jobs: int = 0
    budget_usd: float | None = None
    job_ids: list[str] = field(default_factory=list)

    @property
    def error_pct(self) -> float | None:
        """(actual - estimate) / estimate over the jobs that had an estimate."""
        return 100.0 * (self.actual_usd - self.estimate_usd) / self.estimate_usd if self.estimate_usd else None

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "jobs": self.jobs, "shards": self.shards, "node_seconds": self.node_seconds,
                "actual_usd": self.actual_usd, "estimate_usd": self.estimate_usd, "error_pct": self.error_pct,
                "budget_usd": self.budget_usd,
                "budget_left_usd": None if self.budget_usd is None else self.budget_usd - self.actual_usd}


def job_key(job: JobRow, by: str) -> str:
    if by == "job":
        return job.job_id
    return getattr(job, by) or ("unknown" if by == "owner" else "default")


def rollup(ledger: Ledger, by: str = "job", since: datetime | None = None, *, budgets: dict | None = None,
           prices: PriceTable | None = None) -> list[Group]:
    """Per-group totals of the shards of jobs created since ``since`` (rejected jobs cost nothing)."""
    if by not in BY:
        raise ValueError(f"--by must be one of {BY}, not {by!r}")
    table = prices or load()
    floor = ledger_time(since) if since else ""
    groups: dict[str, Group] = {}
    for job in ledger.jobs(created_since=floor or None, at_once=16):
        if job.status == JobState.REJECTED:
            continue
        key = job_key(job, by)
        g = groups.setdefault(key, Group(key, budget_usd=(budgets or {}).get(by, {}).get(key)))
        g.jobs += 1
        g.job_ids.append(job.job_id)
        for row in ledger.shards(job.job_id):
            seconds = row.paid_seconds
            if seconds <= 0:
                continue
            g.shards += 1
            g.node_seconds += seconds
            g.actual_usd += shard_cost(row, job, table)
        if job.status in FINISHED:
            g.estimate_usd += job.estimate_usd
            g.estimated_jobs += 1
    return sorted(groups.values(), key=lambda g: g.actual_usd, reverse=True)


# -- per shard: a report's rows as mappings ------------------------------------------------------

@dataclass(frozen=True)
class CostLine:
    """Node-seconds and dollars for one (price key, spot) pair; ``usd`` None: key not in the table."""

    key: str
    spot: bool
    node_seconds: float
    shards: int
    usd: float | None
    per_hour: float | None


def row_key(row: Mapping[str, Any], default_key: str | None = None,
            pool_keys: Mapping[str, str] | None = None) -> str:
    """The price key of one shard row: its own price_key, else its pool's key, else the default."""
    key = row.get("price_key") or (pool_keys or {}).get(str(row.get("pool", "")))
    return str(key or default_key or DEFAULT_KEY)


def breakdown(shard_rows: Iterable[Mapping[str, Any]], key: str | None = None, *,
              pool_keys: Mapping[str, str] | None = None, prices: PriceTable | None = None,
              strict: bool = True) -> list[CostLine]:
    """Sum node-seconds per (price key, spot) and price them, each row times its ``share`` of the node
    (default 1). ``strict``: unknown keys raise."""
    table = prices or load()
    sums: dict[tuple[str, bool], list[float]] = {}
    for row in shard_rows:
        seconds = to_float(row.get("node_seconds"))
        if seconds is None or seconds <= 0:
            continue
        acc = sums.setdefault((row_key(row, key, pool_keys), truthy(row.get("spot"))), [0.0, 0, 0.0])
        acc[0] += seconds
        acc[1] += 1
        acc[2] += seconds * (to_float(row.get("share")) or 1.0)  # node-seconds x share: what is billed
    lines = []
    for (k, spot), (seconds, n, shared) in sorted(sums.items()):
        if k not in table and not strict:
            lines.append(CostLine(k, spot, seconds, int(n), None, None))
            continue
        rate = table.get(k).per_hour(spot)
        lines.append(CostLine(k, spot, seconds, int(n), shared / 3600.0 * rate, rate))
    return lines


def actual(shard_rows: Iterable[Mapping[str, Any]], key: str | None = None, *,
           pool_keys: Mapping[str, str] | None = None, prices: PriceTable | None = None) -> float:
    """USD actually spent: the sum of each shard row's node_seconds x its price (spot or PAYG).

    A row's key is its ``price_key``, else ``pool_keys[row["pool"]]``, else ``key``, else "local".
    """
    return sum(line.usd or 0.0 for line in breakdown(shard_rows, key, pool_keys=pool_keys, prices=prices))

def truthy(value: Any) -> bool:
    """Table storage may hand back a bool, a number or a string."""
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "y", "spot")
    return bool(value)


def to_float(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None

def shard_usd(node_seconds: float | None, key: str, spot: bool, share: float = 1.0, *,
              prices: PriceTable | None = None) -> float | None:
    """One shard's cost: node-seconds x price (spot or PAYG) x node share; None for an unknown key."""
    table = prices or load()
    if key not in table:
        return None
    return max(float(node_seconds or 0.0), 0.0) / 3600.0 * table.get(key).per_hour(spot) * float(share or 1.0)


def paid_seconds(row: Mapping[str, Any]) -> float:
    """A shard row's node-seconds that were paid for: the last attempt, and preempted and failed ones."""
    return sum(to_float(row.get(k)) or 0.0 for k in ("node_seconds", "preempted_node_seconds", "failed_node_seconds"))
