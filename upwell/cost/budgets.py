"""Budgets: what is left of one, and the per-owner and per-project budgets a new job is checked against.

A job's own budget (``budget_usd`` on its row) caps the scaler through ``remaining``; a pool's
budget works the same way. The owner and project budgets (``UPWELL_BUDGETS``, over a window of
``UPWELL_BUDGET_WINDOW_DAYS``) are checked at ingest by ``check_budgets`` against the job rows'
recorded spending, and by the janitor.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from upwell.cost.accounting import ledger_time
from upwell.errors import BudgetExceeded, InputRejected

if TYPE_CHECKING:
    from upwell.ledger import Ledger


def remaining(budget_usd: float | None, spent_usd: float) -> float:
    """What is left of a budget; inf without one. Raises BudgetExceeded once spending is over it."""
    if budget_usd is None:
        return math.inf
    left = float(budget_usd) - float(spent_usd)
    if left < 0:
        raise BudgetExceeded(f"spent ${spent_usd:,.2f} of a ${budget_usd:,.2f} budget "
                             f"(${-left:,.2f} over); no more work is dispatched")
    return left


def spent(ledger: Ledger, by: str, value: str, since: datetime) -> float:
    """USD recorded (the job rows' spent_usd) by an owner or project since a date."""
    return sum(job.spent_usd for job in ledger.jobs(created_since=ledger_time(since), at_once=16, **{by: value}))


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
