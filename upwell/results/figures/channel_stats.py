"""Report section for channel statistics: the shards' per-channel stats pooled exactly, as a table and a plot.

``pool(stats)`` combines per-shard {count, mean, std (population), min, max,
missing} dicts with Chan's update, so the pooled values equal those of the
whole file.
"""

from __future__ import annotations

import math

from matplotlib.ticker import MaxNLocator

from upwell.results.figures import Fetch, Section, Table
from upwell.results.figures._common import fmt, metrics_of, missing_note, new_figure, number, succeeded, to_png


def pool(stats: list[dict]) -> dict:
    """Pool one channel's per-shard statistics into the statistics of all their values."""
    count, mean, m2, lo, hi, missing = 0, 0.0, 0.0, math.inf, -math.inf, 0
    for s in stats:
        missing += int(s.get("missing") or 0)
        n = int(s.get("count") or 0)
        if n == 0:
            continue
        m, sd = float(s["mean"]), float(s["std"])
        total = count + n
        delta = m - mean
        mean += delta * n / total
        m2 += sd * sd * n + delta * delta * count * n / total
        count = total
        lo, hi = min(lo, float(s["min"])), max(hi, float(s["max"]))
    if count == 0:
        return {"count": 0, "mean": None, "std": None, "min": None, "max": None, "missing": missing}
    return {"count": count, "mean": mean, "std": math.sqrt(m2 / count), "min": lo, "max": hi, "missing": missing}


def pooled(docs: list[dict]) -> dict[str, dict]:
    per_channel: dict[str, list[dict]] = {}
    for doc in docs:
        for name, s in (metrics_of(doc).get("stats") or {}).items():
            if isinstance(s, dict):
                per_channel.setdefault(name, []).append(s)
    return {name: pool(stats) for name, stats in per_channel.items()}


def sections(results: list[dict], fetch: Fetch) -> list[Section]:
    ok = sorted(succeeded(results), key=lambda d: str(d.get("shard_id", "")))
    note = missing_note(results, ok)
    stats = pooled(ok)
    if not stats:
        return [Section("Channel statistics", text=note or "No shard produced statistics.")]
    names = list(stats)
    table = Table(caption="Per-channel statistics over all shards (population std)",
                  columns=["channel", "count", "mean", "std", "min", "max", "missing"],
                  rows=[[n, *(fmt(stats[n][k]) for k in ("count", "mean", "std", "min", "max", "missing"))]
                        for n in names])
    fig, (left, right) = new_figure(11, 4, ncols=2)
    xs = range(len(names))
    means = [stats[n]["mean"] if stats[n]["mean"] is not None else math.nan for n in names]
    stds = [stats[n]["std"] if stats[n]["std"] is not None else math.nan for n in names]
    left.errorbar(xs, means, yerr=stds, fmt="o", capsize=4, label="mean ± std")
    left.plot(xs, [number(stats[n]["min"]) or math.nan for n in names], "v", color="grey", label="min")
    left.plot(xs, [number(stats[n]["max"]) or math.nan for n in names], "^", color="grey", label="max")
    left.set_xticks(list(xs), names, rotation=45, ha="right")
    left.set(title="All shards", ylabel="value")
    left.legend(fontsize="small")
    for name in names[:12]:
        series = [number(((metrics_of(d).get("stats") or {}).get(name) or {}).get("mean")) for d in ok]
        right.plot(range(len(ok)), [math.nan if v is None else v for v in series], ".-", label=name)
    right.xaxis.set_major_locator(MaxNLocator(integer=True))
    right.set(title="Mean per shard (drift between shards)", xlabel="shard (by id)", ylabel="mean")
    right.legend(fontsize="small", ncols=2)
    rows = sum(int(metrics_of(d).get("rows") or 0) for d in ok)
    text = f"{len(ok)} shards, {rows} rows, {len(names)} channels. {note}".strip()
    return [Section("Channel statistics", text=text, tables=[table],
                    figures=[to_png(fig, "Per-channel mean, spread and extremes; shard-to-shard drift")])]
