"""Report section of a payload definition's ``report``: its metrics table and metric-against-param plots.

The worker copies the definition's ``report`` into each result document, so the
report needs no registry: ``table`` names the metrics shown per shard, and each
of ``plots`` draws metric ``y`` against parameter ``x`` over the shards.
"""

from __future__ import annotations

from upwell.results.figures import Fetch, Section, Table
from upwell.results.figures._common import (
    fmt,
    metrics_of,
    missing_note,
    new_figure,
    number,
    params_of,
    succeeded,
    to_png,
    varying,
)

MAX_ROWS = 500


def spec_of(results: list[dict]) -> dict:
    for doc in results:
        report = doc.get("report") if isinstance(doc, dict) else None
        if isinstance(report, dict) and (report.get("table") or report.get("plots")):
            return report
    return {}


def sections(results: list[dict], fetch: Fetch) -> list[Section]:
    spec = spec_of(results)
    name = next((str(d.get("payload")) for d in results if d.get("payload")), "payload")
    ok = succeeded(results)
    note = missing_note(results, ok)
    if not ok:
        return [Section(name, text=note or "No shard produced metrics.")]
    keys = varying(ok)
    if keys:
        ok.sort(key=lambda d: tuple(number(params_of(d).get(k)) or 0.0 for k in keys))
    columns = [c for c in spec.get("table") or [] if isinstance(c, str)]
    table = Table(caption=f"Per-shard metrics ({', '.join(columns)})", columns=["shard", *keys, *columns],
                  rows=[[str(d.get("shard_id", "")), *(fmt(params_of(d).get(k)) for k in keys),
                         *(fmt(metrics_of(d).get(c)) for c in columns)] for d in ok[:MAX_ROWS]])
    figures = [f for plot in spec.get("plots") or [] if isinstance(plot, dict) for f in [_plot(ok, plot)] if f]
    text = f"{len(ok)} shards with metrics. {note}".strip()
    return [Section(name, text=text, figures=figures, tables=[table] if columns else [])]


def _plot(docs: list[dict], plot: dict):
    x, y = str(plot.get("x", "")), str(plot.get("y", ""))
    points = sorted((px, py) for d in docs for px, py in [(number(params_of(d).get(x)),
                                                          number(metrics_of(d).get(y)))]
                    if px is not None and py is not None)
    if not points:
        return None
    fig, ax = new_figure()
    ax.plot([p[0] for p in points], [p[1] for p in points], "o-", lw=1)
    ax.set(xlabel=x, ylabel=y, title=str(plot.get("title") or f"{y} against {x}"))
    return to_png(fig, str(plot.get("title") or f"{y} against {x}"))
