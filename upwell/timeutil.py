"""UTC timestamps as ISO 8601 strings, the form the ledger and results store."""

from __future__ import annotations

from datetime import UTC, datetime


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_iso(text: str | None) -> datetime | None:
    """An ISO time; one without an offset (a date, or a time written by hand) is read as UTC, so that any two
    compare."""
    if not text:
        return None
    when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def seconds_between(start: str | None, end: str | None) -> float | None:
    a, b = parse_iso(start), parse_iso(end)
    if a is None or b is None:
        return None
    return (b - a).total_seconds()
