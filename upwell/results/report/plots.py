"""Report plots as PNG bytes: the scaling history and a generic metrics plot.

Figures are built with matplotlib's object API on the Agg canvas, never pyplot:
no global figure registry to leak, no backend switch in the host process.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from upwell.results.report.model import ShardView, is_number

DPI = 110
WIDTH = 9.0  # inches; about 1000 px at DPI
MAX_METRICS = 9
STYLE = {
    "font.size": 9, "axes.titlesize": 10, "axes.titleweight": "bold", "axes.labelsize": 9,
    "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.25,
    "axes.edgecolor": "#9aa3ad", "xtick.color": "#4a5561", "ytick.color": "#4a5561",
    "axes.labelcolor": "#2b333b", "legend.frameon": False, "legend.fontsize": 8,
}
STATUS_COLOURS = {
    "succeeded": "#2e9e6b", "failed": "#d64545", "poisoned": "#8c1c1c", "preempted": "#e8a33d",
    "running": "#3b7dd8", "queued": "#9aa3ad", "retried": "#eba0a0", "unknown": "#b8bec5",
}
ACCENT = "#3b7dd8"


@contextmanager
def styled() -> Iterator[None]:
    with matplotlib.rc_context(STYLE):
        yield


def figure(height: float, width: float = WIDTH) -> Figure:
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def to_png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    # No Software/date chunks: the same data gives the same bytes.
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def time_unit(span_s: float) -> tuple[float, str]:
    """A divisor and a name for a time axis that spans span_s seconds."""
    if span_s <= 600:
        return 1.0, "s"
    if span_s <= 3 * 3600:
        return 60.0, "min"
    if span_s <= 3 * 86400:
        return 3600.0, "h"
    return 86400.0, "d"


def colour(status: str) -> str:
    return STATUS_COLOURS.get(status, STATUS_COLOURS["failed"] if status in ("error", "poison") else "#b8bec5")


def scaling_png(points: list[dict], t0: datetime, span_s: float) -> bytes | None:
    """Per pool: target and nodes (steps) against the backlog (shaded, right axis)."""
    if not points:
        return None
    pools = sorted({p["pool"] for p in points})[:4]
    div, unit = time_unit(span_s)
    with styled():
        fig = figure(1.0 + 2.1 * len(pools))
        axes = fig.subplots(len(pools), 1, sharex=True, squeeze=False)[:, 0]
        legend: dict[str, object] = {}
        for ax, pool in zip(axes, pools, strict=True):
            mine = [p for p in points if p["pool"] == pool]
            xs = [(p["ts"] - t0).total_seconds() / div for p in mine]
            back = ax.twinx()
            job = [p.get("job_backlog", p["backlog"]) for p in mine]
            back.fill_between(xs, job, step="post", color="#c9d6e8", alpha=0.6,
                              label="this job's backlog (queued + running)", linewidth=0)
            if any(p["backlog"] != b for p, b in zip(mine, job, strict=True)):
                back.step(xs, [p["backlog"] for p in mine], where="post", color="#8a9bb0", linestyle=":",
                          linewidth=1.2, label="pool backlog (all jobs)")
            back.set_ylabel("backlog (shards)", color="#5b6b7d")
            back.grid(False)
            back.spines["right"].set_visible(True)
            ax.set_zorder(back.get_zorder() + 1)
            ax.patch.set_visible(False)
            ax.step(xs, [p["target"] or 0 for p in mine], where="post", color="#e8a33d", linestyle="--",
                    linewidth=1.6, label="target")
            ax.step(xs, [p["nodes"] or 0 for p in mine], where="post", color=ACCENT, linewidth=2, label="nodes")
            capped = [(x, p["target"] or 0) for x, p in zip(xs, mine, strict=True) if p["capped_by"]]
            if capped:
                ax.scatter(*zip(*capped, strict=True), marker="v", color="#d64545", zorder=5, s=22,
                           label="capped (budget/quota/max)")
            ax.set_ylabel("nodes")
            ax.set_ylim(bottom=0)
            back.set_ylim(bottom=0)
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            back.yaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_title(f"pool {pool}", loc="left")
            handles, labels = ax.get_legend_handles_labels()
            more, more_labels = back.get_legend_handles_labels()
            legend.update(zip(labels + more_labels, handles + more, strict=True))
        axes[-1].set_xlabel(f"time since first queued ({unit})")
        fig.legend(list(legend.values()), list(legend), loc="outside upper center", ncols=len(legend))
        return to_png(fig)


def numeric_metrics(views: list[ShardView]) -> list[str]:
    names: dict[str, None] = {}
    for v in views:
        for k, val in v.metrics.items():
            if is_number(val):
                names.setdefault(k, None)
    return list(names)[:MAX_METRICS]


def sweep_param(views: list[ShardView]) -> str | None:
    """The one numeric parameter that varies across shards, if there is exactly one."""
    keys = {k for v in views for k, val in v.params.items() if is_number(val)}
    varying = [k for k in sorted(keys) if len({v.params.get(k) for v in views if k in v.params}) > 1]
    return varying[0] if len(varying) == 1 else None


def metrics_png(views: list[ShardView]) -> bytes | None:
    """Small multiples: each numeric metric against the swept parameter, or against the shard."""
    done = [v for v in views if v.metrics]
    names = numeric_metrics(done)
    if not names:
        return None
    param = sweep_param(done)
    cols = min(3, len(names))
    rows = -(-len(names) // cols)
    with styled():
        fig = figure(0.4 + 2.4 * rows, width=min(WIDTH, 3.2 * cols + 0.6))
        axes = fig.subplots(rows, cols, squeeze=False).ravel()
        for ax, name in zip(axes, names, strict=False):
            pts = [(v.params.get(param) if param else i, v.metrics[name], v.shard_id)
                   for i, v in enumerate(done) if is_number(v.metrics.get(name))
                   and (param is None or is_number(v.params.get(param)))]
            pts.sort(key=lambda p: p[0])
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            ax.plot(xs, ys, color=ACCENT, linewidth=1, alpha=0.5)
            ax.scatter(xs, ys, color=ACCENT, s=14, zorder=3)
            ax.set_title(name, loc="left")
            ax.set_xlabel(param or "shard")
            if param is None and len(pts) <= 12:
                ax.set_xticks(xs, [p[2] for p in pts], rotation=45, ha="right", fontsize=7)
        for ax in axes[len(names):]:
            ax.set_visible(False)
        return to_png(fig)
