"""Turn each benchmark's JSON into rows of one table: measure, figure, baseline, ratio, goal.

A goal is ``(">=", 0.5)`` or ``("<=", 0.7)``; ``met`` says whether the ratio reaches it. A row without a
ratio (seconds, counts) carries its number in ``value``, so repeated runs still show their spread.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from bench import pairs, probe


def _row(measure: str, figure: str, baseline: str, ratio: float | None, goal: tuple[str, float] | None) -> dict:
    met = None
    if goal is not None and ratio is not None:
        met = ratio >= goal[1] if goal[0] == ">=" else ratio <= goal[1]
    return {"measure": measure, "figure": figure, "baseline": baseline, "ratio": ratio,
            "goal": f"{goal[0]} {goal[1]:g}" if goal else "", "met": met}


def _pipeline(f: dict) -> list[dict]:
    p = f["pipeline"]
    calls = f" ({p['storage_calls_per_item']:.1f} storage calls/item)" if "storage_calls_per_item" in p else ""
    # No goal: a ratio to bare round trips was chased with a job-row cache that delayed a cancel (issue 24);
    # the exact count, storage requests per shard end to end (the scale bench's row), carries the goal now.
    # Ingest against a plain read is the drop bench's (two sizes, goal >= 0.9); see bench_pipeline's docstring.
    return [_row("pipeline items/s ÷ bare Azurite send+receive+delete", f"{p['items_per_s']:.2f}/s{calls}",
                 f"{p['bare_msg_per_s']:.1f}/s", p["ratio"], None)]


def _heat(f: dict) -> list[dict]:
    bw, rk = f["bandwidth"], f["ranks"]
    kernel = f", {bw['kernel']} kernel" if "kernel" in bw else ""
    how = f", CPU time, 90th percentiles of {bw['pairs']} pairs"  # each side's (bench_heat.py)
    return [_row(f"heat stencil GB/s ÷ numpy copy ({bw['n']}²{kernel}{how})", f"{bw['stencil_high_GBps']:.2f} GB/s",
                 f"{bw['copy_high_GBps']:.2f} GB/s", bw["stencil_over_copy"], (">=", 0.5)),
            _row(f"heat-mpi 2 ranks ÷ 1 rank ({rk['nx']}², identical: {rk['fields_identical']})",
                 f"{rk['cells_per_second_2']:.3g} cells/s", f"{rk['cells_per_second_1']:.3g} cells/s",
                 rk["speedup_2_over_1"], None)]


def _train(f: dict) -> list[dict]:
    """bench_train: the medians of the interleaved pairs' ratios, and the median samples/s of each side."""
    r = f["ratios"]
    pay = {k: statistics.median(x[k] for x in f["payload"]) for k in ("loop", "step")}
    bare = {k: statistics.median(x[k] for x in f["bare"]) for k in ("loop", "step")}
    n = f"{len(f['payload'])} pairs, {f.get('threads', '?')} thread(s)"
    return [_row(f"train-torch loop ÷ bare loop ({n})", f"{pay['loop']:,.0f} samples/s",
                 f"{bare['loop']:,.0f} samples/s", r["loop"], (">=", 0.95)),
            # Each loop over its own optimizer steps: what the payload adds around the steps.
            _row("train-torch (loop ÷ steps) ÷ bare (loop ÷ steps)", f"{pay['loop'] / pay['step']:.3f}",
                 f"{bare['loop'] / bare['step']:.3f}", r["own"], (">=", 0.95)),
            _row("train-torch steps ÷ bare steps", f"{pay['step']:,.0f} samples/s", f"{bare['step']:,.0f} samples/s",
                 r["step"], None)]


def _scaling(f: dict) -> list[dict]:
    out = []
    for trace, per in f["ratios"].items():
        v = per["batch-formula"]["cxm"]
        out.append(_row(f"autoscaling cost×makespan ÷ Batch formula, {trace}",
                        f"median of {len(v)} seeds", f"[{min(v):.2f}-{max(v):.2f}]", statistics.median(v),
                        ("<=", 0.7)))
    for trace, per in f.get("clairvoyant", {}).items():
        for policy, v in ((p, v) for p, v in per.items() if p in ("upwell", "batch-formula")):
            out.append(_row(f"{policy} cost×makespan ÷ clairvoyant bound, {trace}", f"median of {len(v)} seeds",
                            f"[{min(v):.2f}-{max(v):.2f}]", statistics.median(v), None))
    return out


def _latency(f: dict) -> list[dict]:
    """Seconds, not a ratio: the figure column holds them, the ratio column stays empty (the goal is 2 s)."""
    s = f["upload_to_start_s"]
    median = statistics.median(s)
    return [{**_row(f"upload → shard started, warm pool, median of {len(s)} (goal ≤ 2 s)", f"{median:.2f} s",
                    f"p90 {sorted(s)[int(0.9 * (len(s) - 1))]:.2f} s", None, None), "met": median <= 2.0,
             "value": median},
            {**_row(f"upload → shard started, cold pool, mean of {len(f.get('cold_runs_s') or [0])}",
                    f"{f['cold_s']:.2f} s", "", None, None), "value": f["cold_s"]}]


def _scale(f: dict) -> list[dict]:
    """Issue 24's scale table: each measure at two sizes, the ratio big ÷ small."""
    small, big = f["small"], f["big"]
    n, m = f"{small['points']:,}", f"{big['points']:,}"
    out = [_row(f"sweep, time to all enqueued, {m} ÷ {n} points", f"{big['enqueued_s']:.1f} s",
                f"{small['enqueued_s']:.1f} s", big["enqueued_s"] / small["enqueued_s"], None),
           _row(f"sweep, ingest time per shard, {m} ÷ {n} points", f"{big['per_shard_ms']:.2f} ms",
                f"{small['per_shard_ms']:.2f} ms", big["per_shard_ms"] / small["per_shard_ms"], ("<=", 1.2))]
    for key, what in (("status_s", "`upwell status JOB`"), ("dashboard_job_s", "dashboard job view")):
        out.append({**_row(f"{what}, {m} ÷ {n} shards (goal ≤ 2 s at {m})", f"{big[key]:.3f} s",
                           f"{small[key]:.3f} s", big[key] / small[key], None), "met": big[key] <= 2.0,
                    **_within(big.get(key.removesuffix("_s") + "_runs_s"))})
    builds = [b / a for a, b in zip(small.get("report_runs_s") or [], big.get("report_runs_s") or [], strict=False)]
    out.append({**_row(f"report build, {big['report_shards']:,} ÷ {small['report_shards']:,} shards",
                       f"{big['report_s']:.1f} s", f"{small['report_s']:.1f} s", big["report_s"] / small["report_s"],
                       ("<=", 1.1 * big["report_shards"] / small["report_shards"])),  # linear, 10% slack
                **_within(builds)})
    return out + _requests(f.get("requests") or {}) + _idle(f.get("idle") or {})


def _requests(per_size: dict) -> list[dict]:
    """Storage requests per shard, end to end, at two sweep sizes: the ratio big ÷ small (flat is 1), met where
    the big sweep's count reaches the issue's goal of 8; then the big sweep's count by service."""
    if "total" in per_size:  # one size, as bench_scale wrote it before it counted two
        per_size = {str(per_size["shards"]): per_size}
    if not per_size:
        return []
    counts = sorted(per_size.values(), key=lambda r: r["shards"])
    a, b = counts[0], counts[-1]
    sizes = f"{b['shards']} ÷ {a['shards']} shards" if len(counts) > 1 else f"{b['shards']} shards"
    out = [{**_row(f"storage requests per shard, end to end, {sizes} (goal ≤ 8)", f"{b['total']:.1f}",
                   f"{a['total']:.1f}" if len(counts) > 1 else "", b["total"] / a["total"] if len(counts) > 1 else None,
                   None), "met": b["total"] <= 8, "value": b["total"]}]
    split = " ".join(f"{k} {b[k]:.1f}" for k in ("table", "blob", "queue") if k in b)
    return out + [_row(f"storage requests per shard by service, {b['shards']} shards", split, "", None, None)]


def _within(samples: list[float] | None) -> dict:
    """The spread of a bench's own repeats within one run (a bench run once): ``spread`` and ``unstable`` as
    ``spread`` below sets them over runs; nothing where there were fewer than two."""
    s = pairs.spread(samples or [])
    return {} if s is None else {"spread": s, "unstable": s > pairs.STABLE}


def _idle(idle: dict) -> list[dict]:
    """Requests of one idle tick of each timer after two numbers of finished jobs: equal, so the ratio is 1."""
    if len(idle) != 2:
        return []
    (n, a), (m, b) = sorted(idle.items(), key=lambda kv: int(kv[0]))
    out = [_row(f"idle {timer} requests per tick, {int(m):,} ÷ {int(n):,} finished jobs", f"{b[timer]}",
                f"{a[timer]}", b[timer] / a[timer] if a[timer] else None, ("<=", 1.0))
           for timer in ("scale", "reconcile", "janitor")]
    out.append(_row(f"idle requests per minute under `upwell up`, {int(m):,} ÷ {int(n):,} finished jobs",
                    f"{b['per_minute']}", f"{a['per_minute']}", b["per_minute"] / a["per_minute"], ("<=", 1.0)))
    return out


def _reconcile(f: dict) -> list[dict]:
    """bench_reconcile, run once: each timed pass is the median of its repeats, against the median bare listing;
    the spread is that of the pass's repeats (``*_runs_s``, where the bench recorded them)."""
    n, new, base = f["blobs"], f["new"], f["list_s"]
    out = [_row(f"reconcile warm pass, listing, nothing new of {n:,} uploads ÷ bare listing", f"{f['warm_s']:.2f} s",
                f"{f['bare_list_s']:.2f} s", f["warm_s"] / f["bare_list_s"], None)]
    for mode in ("listing", "changefeed"):
        m = f[mode]
        seen = f"{m['events']:,} feed records" if mode == "changefeed" else f"{m['listed']:,} listed"
        out += [{**_row(f"reconcile pass, {mode}, {new} new of {n + new:,} ÷ bare listing", f"{m['pass_s']:.2f} s",
                        f"{base:.2f} s", m["pass_s"] / base, None), **_within(m.get("pass_runs_s"))},
                {**_row(f"reconcile incoming/ step, {mode} ({seen}) ÷ bare listing", f"{m['incoming_s']:.2f} s",
                        f"{base:.2f} s", m["incoming_s"] / base, ("<=", 0.1) if mode == "changefeed" else None),
                 **_within(m.get("incoming_runs_s"))}]
    idle = f["changefeed"]["idle_incoming_s"]
    out.append({**_row("reconcile incoming/ step, changefeed, nothing new ÷ bare listing", f"{idle:.2f} s",
                       f"{base:.2f} s", idle / base, None), **_within(f["changefeed"].get("idle_incoming_runs_s"))})
    return out


ROWS: dict[str, Callable[[dict], list[dict]]] = {"pipeline": _pipeline, "heat": _heat, "train": _train,
                                                  "scaling": _scaling, "latency": _latency, "reconcile": _reconcile,
                                                  "scale": _scale}


def _value(row: dict) -> float | None:
    """The number a row's spread is taken over: its ratio, or, for a row of seconds or counts, its value."""
    return row["ratio"] if row["ratio"] is not None else row.get("value")


def spread(runs: list[list[dict]]) -> list[dict]:
    """Rows of repeated runs of one bench as one: the median ratio (or value), the spread (max − min) ÷ median
    of the runs' ratios (or values) in ``spread``, ``unstable`` when it is over ``pairs.STABLE``, and the
    figures of the run whose ratio (or value) is the median."""
    out = []
    for same in zip(*runs, strict=False):
        values = [v for v in map(_value, same) if v is not None]
        if not values:
            out.append({**same[0], "spread": None, "unstable": False, "runs": len(same)})
            continue
        median = statistics.median(values)
        pick = min(same, key=lambda r: abs(v - median) if (v := _value(r)) is not None else float("inf"))
        s = pairs.spread(values)
        row = {**pick, "runs": len(same), "spread": s, "unstable": s is not None and s > pairs.STABLE}
        if pick["ratio"] is None:  # seconds or a count: the median run's figures, met as that run says
            out.append({**row, "value": median})
            continue
        goal = pick["goal"].split() if pick["goal"] else None
        met = None if not goal else (median >= float(goal[1]) if goal[0] == ">=" else median <= float(goal[1]))
        out.append({**row, "ratio": median, "met": met})
    return out


def _drop(f: dict) -> list[dict]:
    """bench_drop, run once: ingest of a small and a large CSV drop (issue 24, item 2). The ratio rows carry the
    spread of their pairs (each download and the ingest after it); the time row, ingest of the large drop ÷ the
    small (linear: their sizes' ratio), the spread of that ratio over the repeats."""
    small, large = f["runs"][0], f["runs"][-1]
    out = [{**_row(f"ingest ÷ plain download of the same blob, {r['mb']} MB drop", f"{min(r['ingest_s']):.2f} s",
                   f"{min(r['plain_s']):.2f} s", r["ratio"], (">=", 0.9)), **_within(r.get("pair_ratios"))}
           for r in f["runs"]]
    # where the rest goes: the read alone (download, check, cut), then recording the job and a work item a shard
    out += [{**_row(f"  its read alone, {r['mb']} MB (then {r['tail_s']:.2f} s for {r['shards']} work items)",
                    f"{min(r['read_s']):.2f} s",
                    f"{min(r['plain_s']):.2f} s", r["read_ratio"], None)} for r in f["runs"] if r.get("read_s")]
    # the most the ratio could read on these cores for the CPU seconds this ingest spends (bench_drop's docstring)
    out += [_row(f"  its ceiling on {r['cores']} cores, {r['mb']} MB: plain ÷ (read CPU ÷ cores + the rest)",
                 "", "", r["ceiling"], None) for r in f["runs"] if r.get("ceiling")]
    times = [b / a for a, b in zip(small["ingest_s"], large["ingest_s"], strict=False)]
    out.append({**_row(f"ingest time, {large['mb']} MB ÷ {small['mb']} MB drop (linear: "
                       f"{large['bytes'] / small['bytes']:.1f})", f"{statistics.median(large['ingest_s']):.2f} s",
                       f"{statistics.median(small['ingest_s']):.2f} s", statistics.median(times), None),
                **_within(times)})
    out.append(_row(f"ingest peak RSS, {large['mb']} MB ÷ {small['mb']} MB drop",
                    f"{large['rss_peak_kb'] / 1024:.0f} MB", f"{small['rss_peak_kb'] / 1024:.0f} MB", f["rss_ratio"],
                    ("<=", 1.2)))
    out += [_row(f"bytes written by ingest ÷ input, {r['mb']} MB drop", f"{max(r['written_bytes']):,} B",
                 f"{r['bytes']:,} B", r["written_ratio"], ("<=", 0.01)) for r in f["runs"]]
    return out


ROWS["drop"] = _drop


def machine(probes: list[dict[str, float]]) -> list[dict]:
    """The machine probe's rows (``bench/probe.py``): each measure's median over the probes taken before each
    bench run, and their spread, so that a bench row that moved can be read beside how far the machine did."""
    if len(probes) < 2:
        return []
    out = []
    for key, (what, fmt) in probe.MEASURES.items():
        values = [p[key] for p in probes]
        median = statistics.median(values)
        out.append({**_row(f"machine: {what}, probed before each of {len(values)} bench runs", fmt.format(median),
                           f"[{min(values):.3g}–{max(values):.3g}]", None, None),
                    "value": median, **_within(values)})
    return out


def rows(name: str, figures: dict | None) -> list[dict]:
    if figures is None:
        return [_row(f"{name}: FAILED (see its log)", "", "", None, None)]
    fn = ROWS.get(name)
    return fn(figures) if fn else []


def render(table: list[dict], summary: dict) -> str:
    w = max(len(r["measure"]) for r in table) if table else 10
    head = f"{'measure':<{w}}  {'upwell':>28}  {'baseline':>18}  {'ratio':>7}  {'spread':>7}  {'goal':>7}  met"
    took = f"  {summary['seconds'] // 60} min {summary['seconds'] % 60} s" if "seconds" in summary else ""
    lines = [f"upwell bench  {summary['time']}  plan {summary.get('plan', 'default')}{took}  load "
             f"{summary['load_before']} -> {summary['load_after']}", head, "-" * len(head)]
    for r in table:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}" if abs(r["ratio"]) >= 0.01 else f"{r['ratio']:.1e}"
        met = {True: "yes", False: "no", None: ""}[r["met"]]
        spread_ = "" if r.get("spread") is None else f"{100 * r['spread']:.1f}%" + ("!" if r.get("unstable") else "")
        lines.append(f"{r['measure']:<{w}}  {r['figure']:>28}  {r['baseline']:>18}  {ratio:>7}  {spread_:>7}  "
                     f"{r['goal']:>7}  {met}")
    unstable = [r["measure"] for r in table if r.get("unstable")]
    if unstable:
        lines.append(f"spread over {100 * pairs.STABLE:g}% between runs (!): " + "; ".join(unstable))
    return "\n".join(lines)
