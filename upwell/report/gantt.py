"""The timeline: one row per worker node, one bar per shard attempt, coloured by status.

Preempted attempts are hatched. A shard that was preempted but whose earlier
attempts were not recorded gets a hatched marker at the start of its last bar.
"""

from __future__ import annotations

from datetime import datetime

from matplotlib.patches import Patch

from upwell.report import plots
from upwell.report.model import Attempt, ShardView

MAX_NODES = 60  # rows drawn; more nodes than this are folded into "(other nodes)"
MAX_LABEL = 28


def bars(views: list[ShardView], now: datetime) -> list[tuple[str, Attempt, ShardView]]:
    """(node, attempt, shard) for every attempt with a start; unfinished ones end at ``now``."""
    out = []
    for v in views:
        for a in v.attempts_drawn():
            end = a.finished or now
            out.append((a.node or "(no node)", Attempt(a.node, a.started, max(end, a.started), a.status), v))
    return out


def _label(node: str) -> str:
    return node if len(node) <= MAX_LABEL else "…" + node[-(MAX_LABEL - 1):]


def gantt_png(views: list[ShardView], t0: datetime, now: datetime, span_s: float) -> bytes | None:
    drawn = bars(views, now)
    if not drawn:
        return None
    nodes = sorted({n for n, _, _ in drawn})
    if len(nodes) > MAX_NODES:
        keep = set(nodes[:MAX_NODES - 1])
        drawn = [(n if n in keep else "(other nodes)", a, v) for n, a, v in drawn]
        nodes = sorted(keep) + ["(other nodes)"]
    row = {n: i for i, n in enumerate(nodes)}
    div, unit = plots.time_unit(span_s)
    min_w = span_s / div / 400 if span_s else 0.01  # keep instant attempts visible
    with plots.styled():
        fig = plots.figure(min(1.2 + 0.42 * len(nodes), 16))
        ax = fig.subplots()
        statuses: dict[str, None] = {}
        for status in sorted({a.status for _, a, _ in drawn}):
            mine = [(n, a) for n, a, _ in drawn if a.status == status]
            left = [(a.started - t0).total_seconds() / div for _, a in mine]
            width = [max((a.finished - a.started).total_seconds() / div, min_w) for _, a in mine]
            hatched = status == "preempted"
            ax.barh([row[n] for n, _ in mine], width, left=left, height=0.62, color=plots.colour(status),
                    edgecolor="white" if not hatched else "#8a5a12", linewidth=0.6,
                    hatch="////" if hatched else None, alpha=0.95)
            statuses[status] = None
        earlier = [(n, a) for n, a, v in drawn if v.preemptions and not v.history and a.status != "preempted"]
        if earlier:
            ax.scatter([(a.started - t0).total_seconds() / div for _, a in earlier], [row[n] for n, _ in earlier],
                       marker="<", s=28, color="#8a5a12", zorder=4)
        _annotate(ax, drawn, row, t0, div, span_s)
        ax.set_yticks(range(len(nodes)), [_label(n) for n in nodes])
        ax.set_ylim(len(nodes) - 0.5, -0.5)
        ax.set_xlim(left=0)
        ax.set_xlabel(f"time since first queued ({unit})")
        ax.grid(axis="y", visible=False)
        handles = [Patch(facecolor=plots.colour(s), hatch="////" if s == "preempted" else None,
                         edgecolor="#8a5a12" if s == "preempted" else "white", label=s) for s in statuses]
        if earlier:
            handles.append(Patch(facecolor="#8a5a12", label="resumed after preemption"))
        fig.legend(handles=handles, loc="outside upper center", ncols=len(handles), fontsize=8)
        return plots.to_png(fig)


def _annotate(ax, drawn, row, t0: datetime, div: float, span_s: float) -> None:
    """Shard ids inside bars that are wide enough, when there are few bars."""
    if len(drawn) > 40 or not span_s:
        return
    for n, a, v in drawn:
        width_s = (a.finished - a.started).total_seconds()
        if width_s >= 0.08 * span_s:
            x = ((a.started - t0).total_seconds() + width_s / 2) / div
            ax.text(x, row[n], v.shard_id[-14:], ha="center", va="center", fontsize=7, color="white",
                    clip_on=True)
