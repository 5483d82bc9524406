"""The tags on everything upwell creates, so a leak can be traced to a project and an owner and found by date.

Every resource carries ``upwell-project``, ``upwell-owner``, ``upwell-expires`` (a
``YYYY-MM-DD`` date) and either ``upwell-pool`` (long-lived: scale sets, Batch pools,
container groups) or ``upwell-job`` (made for one job: Batch jobs). The janitor acts
only on resources that carry ``upwell-project`` (unless told otherwise).
"""

from __future__ import annotations

import os
from datetime import UTC, date, datetime, timedelta
from typing import Any

PROJECT = "upwell-project"
OWNER = "upwell-owner"
JOB = "upwell-job"
POOL = "upwell-pool"
EXPIRES = "upwell-expires"
MARKERS = (PROJECT, POOL, JOB)  # any one of these makes a resource upwell's
DEFAULT_POOL_TTL_DAYS = 30.0  # a pool's tags are renewed whenever it is (re)created


def expires(ttl_days: float, now: datetime | None = None) -> str:
    return ((now or datetime.now(UTC)) + timedelta(days=float(ttl_days))).date().isoformat()


def _pick(options: dict, *keys: str, env: str = "", default: str = "") -> str:
    user = options.get("tags") or {}
    for key in keys:
        if user.get(key):
            return str(user[key])
        if options.get(key):
            return str(options[key])
    return os.environ.get(env, "") or default


def pool_tags(name: str, backend: str, options: dict | None = None, now: datetime | None = None) -> dict[str, str]:
    """Tags of a pool's resources. ``options`` (UPWELL_POOLS.<pool>.options) may give ``tags``
    (copied as they are), ``project``, ``owner`` and ``ttl_days``; else UPWELL_PROJECT, UPWELL_OWNER."""
    options = options or {}
    ttl = float(options.get("ttl_days") or DEFAULT_POOL_TTL_DAYS)
    out = {str(k): str(v) for k, v in (options.get("tags") or {}).items()}
    out.update({
        PROJECT: _pick(options, PROJECT, "project", env="UPWELL_PROJECT", default="upwell"),
        OWNER: _pick(options, OWNER, "owner", env="UPWELL_OWNER", default="upwell"),
        EXPIRES: _pick(options, EXPIRES, "expiry") or expires(ttl, now),
        POOL: name, "upwell-backend": backend,
    })
    return out


def is_upwell(tags: dict[str, Any] | None) -> bool:
    return any(k in (tags or {}) for k in MARKERS)


def expired(tags: dict[str, Any] | None, today: date | None = None) -> bool:
    """True when ``upwell-expires`` is a date before today (an unreadable date never expires)."""
    raw = str((tags or {}).get(EXPIRES) or "")
    try:
        when = date.fromisoformat(raw[:10])
    except ValueError:
        return False
    return when < (today or datetime.now(UTC).date())


def metadata(tags: dict[str, str]) -> list[dict[str, str]]:
    """Batch carries tags as metadata: [{name, value}]."""
    return [{"name": k, "value": v} for k, v in sorted(tags.items())]


def from_metadata(items: Any) -> dict[str, str]:
    out = {}
    for item in items or []:
        name = item.get("name") if isinstance(item, dict) else getattr(item, "name", None)
        value = item.get("value") if isinstance(item, dict) else getattr(item, "value", None)
        if name:
            out[str(name)] = str(value or "")
    return out
