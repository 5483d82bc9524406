"""NCRONTAB parsing and next occurrences: table-driven, plus properties."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from upwell.ncrontab import CrontabError, parse

# Friday 1 March 2024, 12:00:00 UTC.
START = datetime(2024, 3, 1, 12, 0, 0, tzinfo=UTC)


def at(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


@pytest.mark.parametrize(("expression", "expected"), [
    ("*/5 * * * * *", [at(2024, 3, 1, 12, 0, 5), at(2024, 3, 1, 12, 0, 10), at(2024, 3, 1, 12, 0, 15)]),
    ("0 */2 * * * *", [at(2024, 3, 1, 12, 2), at(2024, 3, 1, 12, 4), at(2024, 3, 1, 12, 6)]),
    # Weekdays at 09:30: Monday 4 March is the first after Friday noon.
    ("0 30 9 * * 1-5", [at(2024, 3, 4, 9, 30), at(2024, 3, 5, 9, 30), at(2024, 3, 6, 9, 30)]),
    ("0 0 * * * *", [at(2024, 3, 1, 13), at(2024, 3, 1, 14), at(2024, 3, 1, 15)]),
    ("0 0 9-10 * * *", [at(2024, 3, 2, 9), at(2024, 3, 2, 10), at(2024, 3, 3, 9)]),
    ("0 0,15,45 12 * * *", [at(2024, 3, 1, 12, 15), at(2024, 3, 1, 12, 45), at(2024, 3, 2, 12, 0)]),
    ("0 0 0 1-10/3 * *", [at(2024, 3, 4), at(2024, 3, 7), at(2024, 3, 10)]),
    ("5/20 * * * * *", [at(2024, 3, 1, 12, 0, 5), at(2024, 3, 1, 12, 0, 25), at(2024, 3, 1, 12, 0, 45)]),
    ("0 0 12 * jan-Mar SUN", [at(2024, 3, 3, 12), at(2024, 3, 10, 12), at(2024, 3, 17, 12)]),
    ("0 0 0 1 JAN,jul *", [at(2024, 7, 1), at(2025, 1, 1), at(2025, 7, 1)]),
    ("0 0 0 31 * *", [at(2024, 3, 31), at(2024, 5, 31), at(2024, 7, 31)]),
    ("0 0 0 29 2 *", [at(2028, 2, 29), at(2032, 2, 29), at(2036, 2, 29)]),
    # Day of month AND day of week, as NCrontab (not the OR of Unix cron): Friday the 13th.
    ("0 0 0 13 * 5", [at(2024, 9, 13), at(2024, 12, 13), at(2025, 6, 13)]),
    ("  0   0   0   *   *   0  ", [at(2024, 3, 3), at(2024, 3, 10), at(2024, 3, 17)]),
])
def test_next_occurrences(expression: str, expected: list[datetime]) -> None:
    assert parse(expression).occurrences(START, 3) == expected


@pytest.mark.parametrize(("expression", "message"), [
    ("* * * * *", "has 5 fields; NCRONTAB needs 6"),
    ("0 0 0 * * * *", "has 7 fields"),
    ("", "has 0 fields"),
    ("60 * * * * *", "second field: 60 is outside 0-59"),
    ("0 60 * * * *", "minute field: 60 is outside 0-59"),
    ("0 0 24 * * *", "hour field: 24 is outside 0-23"),
    ("0 0 0 0 * *", "day field: 0 is outside 1-31"),
    ("0 0 0 * 13 *", "month field: 13 is outside 1-12"),
    ("0 0 0 * * 7", "day-of-week field: 7 is outside 0-6"),
    ("*/0 * * * * *", "second field: step '0' must be a positive number"),
    ("*/x * * * * *", "second field: step 'x' must be a positive number"),
    ("0 30-10 * * * *", "minute field: range '30-10' runs backwards"),
    ("0 0 0 * FOO *", "month field: 'FOO' is not a number or one of JAN"),
    ("0 0 0 * * FUNDAY", "day-of-week field: 'FUNDAY' is not a number or one of SUN"),
    ("0 1,,2 * * * *", "minute field: empty list item"),
    ("0 0 0 31 2 *", "never fires"),
    ("0 0 0 31 2,4,6,9,11 *", "never fires"),
    ("0 -1 * * * *", "minute field: '' is not a number"),
])
def test_invalid_expressions_name_the_field(expression: str, message: str) -> None:
    with pytest.raises(CrontabError, match=message.replace("(", r"\(").replace("*", r"\*")):
        parse(expression)


def test_not_a_string() -> None:
    with pytest.raises(CrontabError, match="must be a string"):
        parse(None)  # type: ignore[arg-type]


def test_naive_datetimes_and_microseconds() -> None:
    result = parse("*/10 * * * * *").next_after(datetime(2024, 1, 1, 0, 0, 9, 999_999))
    assert result == datetime(2024, 1, 1, 0, 0, 10)
    assert result.tzinfo is None


def test_strictly_after_an_occurrence() -> None:
    schedule = parse("0 0 12 * * *")
    assert schedule.next_after(START) == at(2024, 3, 2, 12)
    assert schedule.matches(START)


def test_year_and_month_rollover() -> None:
    assert parse("59 59 23 31 12 *").next_after(at(2024, 12, 31, 23, 59, 59)) == at(2025, 12, 31, 23, 59, 59)
    assert parse("0 0 0 1 * *").next_after(at(2024, 12, 15)) == at(2025, 1, 1)


_SIX = st.tuples(
    st.sampled_from(["*", "0", "*/5", "10-20", "0,30", "7/13"]),
    st.sampled_from(["*", "0", "*/15", "5-10", "1,2,3"]),
    st.sampled_from(["*", "0", "*/6", "9-17", "8,12,18"]),
    st.sampled_from(["*", "1", "*/7", "10-20", "1,15,28"]),
    st.sampled_from(["*", "1", "*/3", "JAN-JUN", "2,11"]),
    st.sampled_from(["*", "0", "1-5", "SAT,SUN", "*/2"]),
).map(" ".join)


@settings(max_examples=150, deadline=None)
@given(_SIX, st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2090, 1, 1)))
def test_next_after_is_the_first_match(expression: str, start: datetime) -> None:
    """The result matches, is later, and no second in between matches (checked over a bounded window)."""
    schedule = parse(expression)
    found = schedule.next_after(start)
    assert found > start and schedule.matches(found)
    probe = start.replace(microsecond=0) + timedelta(seconds=1)
    for _ in range(min(int((found - probe).total_seconds()), 400)):
        assert not schedule.matches(probe)
        probe += timedelta(seconds=1)
