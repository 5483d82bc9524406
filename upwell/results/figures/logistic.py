"""Report section for the logistic-map sweep: a bifurcation diagram and the Lyapunov exponent against r."""

from __future__ import annotations

from upwell.results.figures import Fetch, Section, Table
from upwell.results.figures._common import fmt, metrics_of, missing_note, new_figure, number, succeeded, to_png

MAX_ROWS = 200


def sections(results: list[dict], fetch: Fetch) -> list[Section]:
    ok = sorted(succeeded(results), key=lambda d: number(metrics_of(d).get("r")) or 0.0)
    note = missing_note(results, ok)
    if not ok:
        return [Section("Logistic map", text=note or "No shard produced metrics.")]
    rows = [(number(m.get("r")), number(m.get("lyapunov")), m.get("period"), m.get("mean"),
             [x for x in (m.get("attractor") or []) if number(x) is not None])
            for m in map(metrics_of, ok)]
    rows = [r for r in rows if r[0] is not None]
    fig, (left, right) = new_figure(10, 4, ncols=2)
    for r, _, _, _, points in rows:
        left.plot([r] * len(points), points, ".", color="k", ms=1.5, alpha=0.5)
    left.set(xlabel="r", ylabel="x (attractor)", title="Bifurcation diagram")
    right.plot([r[0] for r in rows], [r[1] for r in rows], ".-", lw=0.8)
    right.axhline(0.0, color="grey", lw=0.8)
    right.set(xlabel="r", ylabel="Lyapunov exponent", title="Chaos where the exponent is positive")
    table = Table(caption="Per-shard summary (sorted by r)", columns=["r", "period", "lyapunov", "mean"],
                  rows=[[fmt(r), fmt(period) if period else "chaotic", fmt(lyap), fmt(mean)]
                        for r, lyap, period, mean, _ in rows[:MAX_ROWS]])
    chaotic = sum(1 for r in rows if (r[1] or 0.0) > 0)
    text = f"{len(rows)} values of r; {chaotic} with a positive Lyapunov exponent. {note}".strip()
    return [Section("Logistic map", text=text,
                    figures=[to_png(fig, "Attractor points and Lyapunov exponent against r")], tables=[table])]
