"""The timeline: one row per worker node, one bar per shard attempt, coloured by status.

Preempted attempts are hatched. A shard that was preempted but whose earlier
attempts were not recorded gets a hatched marker at the start of its last bar.
"""

from __future__ import annotations

from datetime import datetime

from matplotlib.patches import Patch

from upwell.results.report import plots
from upwell.results.report.model import EARLIER, Attempt, ShardView, natural

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


def place(drawn: list[tuple[str, Attempt, ShardView]], row: dict[str, int]) -> list[tuple[float, float]]:
    """(y, height) per bar: attempts that overlap on one node (tasks_per_node > 1) get lanes."""
    lanes_of: dict[str, list] = {}
    lane = [0] * len(drawn)
    for i in sorted(range(len(drawn)), key=lambda i: drawn[i][1].started):
        node, a, _ = drawn[i]
        ends = lanes_of.setdefault(node, [])
        free = next((k for k, end in enumerate(ends) if end <= a.started), None)
        if free is None:
            ends.append(a.finished)
            free = len(ends) - 1
        else:
            ends[free] = a.finished
        lane[i] = free
    out = []
    for i, (node, _, _) in enumerate(drawn):
        n = len(lanes_of[node])
        band = 0.72 / n
        out.append((row[node] - 0.36 + band * (lane[i] + 0.5), band * 0.86))
    return out


def gantt_png(views: list[ShardView], t0: datetime, now: datetime, span_s: float) -> bytes | None:
    drawn = bars(views, now)
    if not drawn:
        return None
    nodes = sorted({n for n, _, _ in drawn} - {EARLIER}, key=natural)
    if len(nodes) > MAX_NODES:
        keep = set(nodes[:MAX_NODES - 1])
        drawn = [(n if n in keep or n == EARLIER else "(other nodes)", a, v) for n, a, v in drawn]
        nodes = nodes[:MAX_NODES - 1] + ["(other nodes)"]
    if any(n == EARLIER for n, _, _ in drawn):
        nodes.append(EARLIER)
    slots = place(drawn, {n: i for i, n in enumerate(nodes)})
    div, unit = plots.time_unit(span_s)
    min_w = span_s / div / 400 if span_s else 0.01  # keep instant attempts visible
    x = [(a.started - t0).total_seconds() / div for _, a, _ in drawn]
    w = [max((a.finished - a.started).total_seconds() / div, min_w) for _, a, _ in drawn]
    with plots.styled():
        fig = plots.figure(min(1.2 + 0.42 * len(nodes), 16))
        ax = fig.subplots()
        statuses = sorted({a.status for _, a, _ in drawn})
        for status in statuses:
            idx = [i for i, (_, a, _) in enumerate(drawn) if a.status == status]
            hatched = status == "preempted"
            ax.barh([slots[i][0] for i in idx], [w[i] for i in idx], left=[x[i] for i in idx],
                    height=[slots[i][1] for i in idx], color=plots.colour(status),
                    edgecolor="#8a5a12" if hatched else "white", linewidth=0.6,
                    hatch="////" if hatched else None)
        resumed = [i for i, (_, _, v) in enumerate(drawn) if v.preemptions and len(v.attempts_drawn()) == 1]
        if resumed:
            ax.scatter([x[i] for i in resumed], [slots[i][0] for i in resumed], marker="<", s=28,
                       color="#8a5a12", zorder=4)
        _annotate(ax, drawn, slots, x, w, span_s / div)
        ax.set_yticks(range(len(nodes)), [_label(n) for n in nodes])
        ax.set_ylim(len(nodes) - 0.5, -0.5)
        ax.set_xlim(left=0)
        ax.set_xlabel(f"time since first queued ({unit})")
        ax.grid(axis="y", visible=False)
        handles = [Patch(facecolor=plots.colour(s), hatch="////" if s == "preempted" else None,
                         edgecolor="#8a5a12" if s == "preempted" else "white", label=s) for s in statuses]
        if resumed:
            handles.append(Patch(facecolor="#8a5a12", label="◀ resumed after preemption"))
        fig.legend(handles=handles, loc="outside upper center", ncols=len(handles), fontsize=8)
        return plots.to_png(fig)


def _annotate(ax, drawn, slots, x, w, span: float) -> None:
    """Shard ids inside bars that are wide and tall enough, when there are few bars."""
    if len(drawn) > 40 or not span:
        return
    for i, (_, _, v) in enumerate(drawn):
        if w[i] >= 0.08 * span and slots[i][1] >= 0.3:
            ax.text(x[i] + w[i] / 2, slots[i][0], v.shard_id[-14:], ha="center", va="center", fontsize=7,
                    color="white", clip_on=True)
