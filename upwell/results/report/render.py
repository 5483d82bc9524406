"""HTML rendering: one Jinja2 template with autoescape on, and the formatting filters.

Everything from the job (names, errors, stderr, params) is data and is escaped;
nothing reaches the page unescaped except the template's own markup and CSS.
"""

from __future__ import annotations

import base64
from functools import lru_cache
from typing import Any

import jinja2

from upwell.results.report.model import parse_ts


def num(value: Any) -> str:
    """A table cell: thousands separators for big numbers, 4 significant digits otherwise."""
    if value is None or value == "":
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != value:
            return "NaN"
        if value == 0:
            return "0"
        if abs(value) >= 1e15 or (value != 0 and abs(value) < 1e-3):
            return f"{value:.3e}"
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return str(value)


def dur(seconds: Any) -> str:
    """Seconds as a readable duration: 12.3 s, 4 min 05 s, 2 h 03 min, 1 d 02 h."""
    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or seconds != seconds:
        return "—"
    s = float(seconds)
    if s < 60:
        return f"{s:.1f} s" if s < 10 else f"{s:.0f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    if s < 86400:
        return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"
    return f"{int(s // 86400)} d {int(s % 86400 // 3600):02d} h"


def usd(value: Any) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool) or value != value:
        return "—"
    sign, a = ("−" if value < 0 else ""), abs(value)
    if a == 0:
        return "$0.00"
    if a < 0.0001:
        return f"{sign}<$0.0001"
    # Small jobs cost cents: keep three significant digits below a dollar.
    return f"{sign}${a:,.2f}" if a >= 1 else f"{sign}${a:.3g}"


def ts(value: Any) -> str:
    parsed = parse_ts(value)
    return parsed.strftime("%Y-%m-%d %H:%M:%S UTC") if parsed else "—"


def datauri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("upwell.results.report", "templates"), autoescape=True,
                             trim_blocks=True, lstrip_blocks=True, undefined=jinja2.ChainableUndefined)
    env.filters.update(num=num, dur=dur, usd=usd, ts=ts, datauri=datauri)
    return env


MAX_FAILURES = 50  # shown in full (error and stderr); the rest by id
MAX_ROWS = 1000  # shard table rows (upwell.results.report.table); summary.json and shards.csv have every shard


def render(summary: dict, **extra: Any) -> str:
    """The page; ``shown`` is the shard table's rows (default: every shard)."""
    extra.setdefault("max_failures", MAX_FAILURES)
    extra.setdefault("shown", summary.get("shards") or [])
    return environment().get_template("report.html.j2").render(s=summary, **extra)
