"""NCRONTAB, the six-field cron dialect of Azure Functions timer triggers. Pure.

``{second} {minute} {hour} {day} {month} {day-of-week}``; each field takes ``*``,
a number, a range ``a-b``, a list ``a,b,c``, and a step ``*/n``, ``a-b/n`` or
``a/n`` (from a to the field's maximum). Months take ``JAN``..``DEC`` and days of
the week ``SUN``..``SAT`` (0 is Sunday, as in .NET), in any case.

As in the NCrontab library that the Functions host uses, an occurrence must
match *every* field: a restricted day of month and a restricted day of week are
combined with AND, not with the OR of Unix cron.

``next_after(dt)`` works on the wall clock of ``dt`` (naive or aware); the host
passes UTC, which is what Azure uses unless WEBSITE_TIME_ZONE says otherwise.
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import datetime, timedelta


class CrontabError(ValueError):
    """An expression that is not valid NCRONTAB; the message names the field and the value."""


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    names: tuple[str, ...] = ()  # names[i] is the value low + i


_FIELDS = (
    _Field("second", 0, 59),
    _Field("minute", 0, 59),
    _Field("hour", 0, 23),
    _Field("day", 1, 31),
    _Field("month", 1, 12, ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")),
    _Field("day-of-week", 0, 6, ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")),
)
# How far ahead to look: 29 February on a given weekday can be 40 years apart (century rule).
_HORIZON_YEARS = 100


def _value(field: _Field, text: str, expr: str) -> int:
    upper = text.upper()
    if upper in field.names:
        return field.low + field.names.index(upper)
    if not (text.isascii() and text.isdigit()):
        hint = f" or one of {', '.join(field.names)}" if field.names else ""
        raise CrontabError(f"{field.name} field: {text!r} is not a number{hint} (in {expr!r})")
    number = int(text)
    if not field.low <= number <= field.high:
        raise CrontabError(f"{field.name} field: {number} is outside {field.low}-{field.high} (in {expr!r})")
    return number


def _part(field: _Field, part: str, expr: str) -> set[int]:
    base, _, step_text = part.partition("/")
    step = 1
    if step_text:
        if not (step_text.isascii() and step_text.isdigit()) or int(step_text) == 0:
            raise CrontabError(f"{field.name} field: step {step_text!r} must be a positive number (in {expr!r})")
        step = int(step_text)
    if base == "*":
        low, high = field.low, field.high
    elif "-" in base:
        first, _, last = base.partition("-")
        low, high = _value(field, first, expr), _value(field, last, expr)
        if low > high:
            raise CrontabError(f"{field.name} field: range {base!r} runs backwards (in {expr!r})")
    else:
        low = _value(field, base, expr)
        high = field.high if step_text else low
    return set(range(low, high + 1, step))


def _parse_field(field: _Field, text: str, expr: str) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        if not part:
            raise CrontabError(f"{field.name} field: empty list item in {text!r} (in {expr!r})")
        values |= _part(field, part, expr)
    return frozenset(values)


@dataclass(frozen=True)
class Crontab:
    """A parsed schedule: the allowed values of each field, and the source text."""

    expression: str
    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday

    def matches(self, dt: datetime) -> bool:
        return (dt.second in self.seconds and dt.minute in self.minutes and dt.hour in self.hours
                and self._day_matches(dt))

    def _day_matches(self, dt: datetime) -> bool:
        return (dt.month in self.months and dt.day in self.days
                and (dt.weekday() + 1) % 7 in self.weekdays)

    def next_after(self, dt: datetime) -> datetime:
        """The first occurrence strictly after ``dt``, to the second, in ``dt``'s timezone."""
        t = dt.replace(microsecond=0) + timedelta(seconds=1)
        limit = dt.year + _HORIZON_YEARS
        while t.year <= limit:
            if t.month not in self.months:
                t = (t.replace(day=1, hour=0, minute=0, second=0) + timedelta(days=32)).replace(day=1)
            elif not self._day_matches(t):
                t = t.replace(hour=0, minute=0, second=0) + timedelta(days=1)
            elif t.hour not in self.hours:
                t = t.replace(minute=0, second=0) + timedelta(hours=1)
            elif t.minute not in self.minutes:
                t = t.replace(second=0) + timedelta(minutes=1)
            elif t.second not in self.seconds:
                t += timedelta(seconds=1)
            else:
                return t
        raise CrontabError(f"{self.expression!r} has no occurrence within {_HORIZON_YEARS} years of {dt}")

    def occurrences(self, dt: datetime, count: int) -> list[datetime]:
        """The next ``count`` occurrences after ``dt``."""
        out: list[datetime] = []
        for _ in range(count):
            dt = self.next_after(dt)
            out.append(dt)
        return out

    def __str__(self) -> str:
        return self.expression


def _check_days_exist(expr: str, days: frozenset[int], months: frozenset[int]) -> None:
    longest = max(calendar.monthrange(2024, m)[1] for m in months)  # 2024: a leap year
    if min(days) > longest:
        raise CrontabError(f"day field: no month in the month field has day {min(days)}, so "
                           f"{expr!r} never fires")


def parse(expression: str) -> Crontab:
    """Parse a six-field NCRONTAB expression; raise CrontabError naming the field at fault."""
    if not isinstance(expression, str):
        raise CrontabError(f"a schedule must be a string, not {type(expression).__name__}")
    parts = expression.split()
    if len(parts) != 6:
        raise CrontabError(
            f"{expression!r} has {len(parts)} fields; NCRONTAB needs 6: "
            "{second} {minute} {hour} {day} {month} {day-of-week}, for example '0 */5 * * * *'")
    values = [_parse_field(f, p, expression) for f, p in zip(_FIELDS, parts, strict=True)]
    _check_days_exist(expression, values[3], values[4])
    return Crontab(" ".join(parts), *values)
