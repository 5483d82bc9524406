"""A job's report: ``reports/<job>/index.html``, ``summary.json``, ``shards.csv`` and ``figures/<name>.png``.

``build_report`` is pure apart from calling ``fetch`` (through the payload's figures
module): it takes the ledger's typed rows (JobRow, ShardRow), the result documents
and the scale events, and
returns the files as bytes, keyed by their path under ``reports/<job>/``. The
caller writes them. The HTML is self-contained (inline CSS, PNGs as ``data:``
URIs, no scripts or fonts from elsewhere) so it opens offline and survives being
mailed around. Result documents and scale events are read defensively: a report is
built for zero results, all-failed jobs and half-written rows alike.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from upwell import cost, logs
from upwell.results.figures import Figure as SectionFigure
from upwell.results.figures import Section, sections_for
from upwell.results.figures import declared as definition_figures
from upwell.results.report import gantt, plots
from upwell.results.report import table as shard_table
from upwell.results.report.analysis import section as analysis_section
from upwell.results.report.model import ShardView, merge
from upwell.results.report.render import MAX_ROWS, render
from upwell.results.report.summary import scale_points, summarize
from upwell.rows import JobRow, ShardRow

__all__ = ["build_report"]

log = logs.get("upwell.results.report")
Fetch = Callable[[str], bytes]


def build_report(job: JobRow, shards: Iterable[ShardRow], results: list[dict], scale_events: list[dict],
                 fetch: Fetch, prices: cost.PriceTable | None = None, analysis: dict | None = None) -> dict[str, bytes]:
    """Build the report files of one job; keys are paths relative to ``reports/<job>/``. ``analysis``: the
    job's reduce step (upwell.after.reduce.view), shown first under "Analysis" and kept in summary.json."""
    results = [r for r in results or () if isinstance(r, dict)]
    events = [e for e in scale_events or () if isinstance(e, dict)]
    table = prices or cost.load()
    views = merge(shards, results)
    summary = summarize(job, views, results, events, table)
    figures = _Figures()
    points = scale_points(events, views)
    t0, now, span = _time_frame(views, points)
    timeline = scaling = None
    if t0 is not None:
        timeline = figures.add("timeline", gantt.gantt_png(views, t0, now, span))
        scaling = figures.add("scaling", plots.scaling_png(points, t0, span))
    found = _payload_sections(job, views, results, fetch)
    if analysis:
        found.insert(0, analysis_section(analysis, fetch))
        summary["analysis"] = analysis
    sections = [_rendered(s, figures) for s in found]
    summary["figures"] = [f"figures/{name}" for name in figures.pngs]
    html = render(summary, sections=sections, timeline=timeline, scaling=scaling,
                  columns=_columns(summary["shards"]), shown=shard_table.shown(summary["shards"], MAX_ROWS))
    files = {"index.html": html.encode("utf-8"), "summary.json": to_json(summary),
             "shards.csv": shard_table.to_csv(summary["shards"])}
    files.update({f"figures/{name}": png for name, png in figures.pngs.items()})
    return files


class _Figures:
    """The PNGs written under figures/, with unique, file-safe names."""

    def __init__(self) -> None:
        self.pngs: dict[str, bytes] = {}

    def add(self, stem: str, png: bytes | None) -> dict | None:
        if not png:
            return None
        base = re.sub(r"[^a-z0-9]+", "-", stem.lower()).strip("-")[:60] or "figure"
        name, i = f"{base}.png", 2
        while name in self.pngs:
            name, i = f"{base}-{i}.png", i + 1
        self.pngs[name] = png
        return {"name": f"figures/{name}", "png": png}


def _time_frame(views: list[ShardView], points: list[dict]) -> tuple[datetime | None, datetime | None, float]:
    starts = [t for v in views for t in (v.queued, v.started) if t]
    starts += [a.started for v in views for a in v.history]
    ends = [t for v in views for t in (v.started, v.finished) if t] + [p["ts"] for p in points]
    ends += [a.finished for v in views for a in v.history if a.finished]
    t0 = min(starts + [p["ts"] for p in points], default=None)
    if t0 is None:
        return None, None, 0.0
    now = max(ends + starts, default=t0)
    return t0, now, (now - t0).total_seconds()


def _payload_sections(job: JobRow, views: list[ShardView], results: list[dict], fetch: Fetch) -> list[Section]:
    """Each payload's own sections, or a generic metrics plot when it has no figures module."""
    kinds: dict[str, list[dict]] = {}
    for r in results:
        kinds.setdefault(str(r.get("payload") or job.payload or "results"), []).append(r)
    out: list[Section] = []
    for kind, docs in kinds.items():
        fn = sections_for(kind)
        if fn is None and definition_figures.spec_of(docs):  # a definition's report: table and plots
            fn = definition_figures.sections
        if fn is None:
            out.extend(_generic(kind, [v for v in views if v.has_result and (v.payload or kind) == kind]))
            continue
        try:
            made = list(fn(docs, fetch) or ())
            out.extend(s for s in made if isinstance(s, Section))
        except Exception as exc:  # noqa: BLE001 - a figures module must never cost the job its report
            log.warning("report.sections_failed", payload=kind, error=repr(exc))
            out.append(Section(f"{kind}: figures unavailable",
                               f"The {kind} figures module raised {type(exc).__name__}: {exc}"))
    return out


def _generic(kind: str, views: list[ShardView]) -> list[Section]:
    png = plots.metrics_png(views)
    if png is None:
        return []
    param = plots.sweep_param([v for v in views if v.metrics])
    caption = f"Each numeric metric against {param!r}" if param else "Each numeric metric, shard by shard"
    return [Section(f"{kind}: metrics", "This payload has no figures module; these are its numeric metrics.",
                    figures=[SectionFigure(caption, png)])]


def _rendered(section: Section, figures: _Figures) -> dict:
    figs = []
    for i, f in enumerate(section.figures):
        added = figures.add(f"{section.title}-{i + 1}" if len(section.figures) > 1 else section.title, f.png)
        if added:
            figs.append({**added, "caption": f.caption})
    return {"title": section.title, "text": section.text, "figures": figs,
            "tables": [{"caption": t.caption, "columns": list(t.columns), "rows": [list(r) for r in t.rows]}
                       for t in section.tables]}


MAX_COLUMNS = 24


def _columns(rows: list[dict]) -> dict:
    """Params and metrics columns of the shard table: the union over shards, in first-seen order."""
    params: dict[str, None] = {}
    metrics: dict[str, None] = {}
    for r in rows:
        params.update(dict.fromkeys(r["params"]))
        metrics.update(dict.fromkeys(r["metrics"]))
    p, m = list(params), list(metrics)
    return {"params": p[:MAX_COLUMNS], "metrics": m[:MAX_COLUMNS],
            "omitted": max(len(p) - MAX_COLUMNS, 0) + max(len(m) - MAX_COLUMNS, 0)}


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_clean(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if value is None or isinstance(value, str | int | bool):
        return value
    return str(value)


def to_json(summary: dict) -> bytes:
    """Strict JSON: NaN and infinity become null."""
    return json.dumps(_clean(summary), indent=2, allow_nan=False, ensure_ascii=False).encode("utf-8")
