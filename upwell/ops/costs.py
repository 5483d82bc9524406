"""Cost per job, owner and project, summed from the shards' own figures; budgets per owner and project.

A shard costs its paid node-seconds x the price of its node (spot or pay-as-you-go) x the job's
share of a node (upwell.cost.shard_usd). ``rollup`` sums those per job, owner or project for the
jobs created since a date, beside their estimates and the estimate's error, so `upwell cost`
agrees with the per-shard figures in the reports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from upwell import cost
from upwell.errors import InputRejected
from upwell.ledger import JobRow, JobState, Ledger, ShardRow

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


def _iso(when: datetime) -> str:
    """As the ledger writes times (upwell.timeutil.now_iso), so strings compare in time order."""
    return when.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def shard_cost(row: ShardRow, job: JobRow, table: cost.PriceTable | None = None) -> float:
    key = row.price_key or job.price_key or cost.DEFAULT_KEY
    usd = cost.shard_usd(row.paid_seconds, key, row.spot, job.node_share or 1.0, prices=table)
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
           prices: cost.PriceTable | None = None) -> list[Group]:
    """Per-group totals of the shards of jobs created since ``since`` (rejected jobs cost nothing)."""
    if by not in BY:
        raise ValueError(f"--by must be one of {BY}, not {by!r}")
    table = prices or cost.load()
    floor = _iso(since) if since else ""
    groups: dict[str, Group] = {}
    for job in ledger.jobs():
        if job.status == JobState.REJECTED or job.created_at < floor:
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


def spent(ledger: Ledger, by: str, value: str, since: datetime) -> float:
    """USD recorded (the job rows' spent_usd) by an owner or project since a date."""
    return sum(job.spent_usd for job in ledger.jobs(created_since=_iso(since), **{by: value}))


def check_budgets(ledger: Ledger, settings: Any, *, owner: str, project: str, estimate_usd: float) -> None:
    """Refuse a job whose estimate would take its owner or project past their budget for the window."""
    since = datetime.now(UTC) - timedelta(days=float(settings.budget_window_days))
    for by, value in (("owner", owner), ("project", project)):
        budget = (settings.budgets or {}).get(by, {}).get(value)
        if budget is None:
            continue
        used = spent(ledger, by, value, since)
        if used + estimate_usd > budget:
            raise InputRejected(
                f"{by} {value!r} has spent ${used:,.2f} of a ${budget:,.2f} budget in the last "
                f"{settings.budget_window_days:g} days; this job's estimate ${estimate_usd:,.2f} would pass it",
                field=by, limit=f"budget_usd[{by}={value}]={budget}")
