"""``make bench``'s default plan (``bench/plan.py``) prints every measure of issue 24's scale table, each at two
sizes with its ratio: the rows its benches make from figures of the plan's own sizes are checked against the
issue's list, so a bench dropped from the plan, or a row dropped from ``bench/rows.py``, fails here."""

from __future__ import annotations

import re

import pytest

from bench import plan, rows

# Issue 24, item 6: each measure of the scale table, as its row names it: (bench, pattern of the measure).
# The two sizes are the pattern's groups, the big one first; a measure of one size at each is listed per size.
SCALE_TABLE = {
    "drop: ingest time": ("drop", r"ingest time, (\d+) MB ÷ (\d+) MB drop"),
    "drop: peak RSS": ("drop", r"ingest peak RSS, (\d+) MB ÷ (\d+) MB drop"),
    "drop: bytes written ÷ input, small": ("drop", r"bytes written by ingest ÷ input, (\d+) MB drop"),
    "drop: bytes written ÷ input, big": ("drop", r"bytes written by ingest ÷ input, (\d+) MB drop"),
    "drop: ingest ÷ plain download": ("drop", r"ingest ÷ plain download of the same blob, (\d+) MB drop"),
    "sweep: time to all enqueued": ("scale", r"sweep, time to all enqueued, ([\d,]+) ÷ ([\d,]+) points"),
    "sweep: per-shard ingest time": ("scale", r"sweep, ingest time per shard, ([\d,]+) ÷ ([\d,]+) points"),
    "status": ("scale", r"`upwell status JOB`, ([\d,]+) ÷ ([\d,]+) shards"),
    "dashboard": ("scale", r"dashboard job view, ([\d,]+) ÷ ([\d,]+) shards"),
    "report": ("scale", r"report build, ([\d,]+) ÷ ([\d,]+) shards"),
    "storage requests per shard": ("scale", r"storage requests per shard, end to end, ([\d,]+) ÷ ([\d,]+) shards"),
}


def _arg(step: plan.Step, flag: str) -> str:
    return step.args[step.args.index(flag) + 1]


def _figures(step: plan.Step) -> dict:
    """Figures of the shape the bench writes, at the sizes the plan gives it."""
    if step.bench == "drop":
        def run(mb: int) -> dict:
            return {"mb": mb, "bytes": mb * 10**6, "ingest_s": [mb / 50, mb / 45], "plain_s": [mb / 60, mb / 55],
                    "ratio": 0.85, "pair_ratios": [0.84, 0.86], "written_bytes": [mb * 40], "written_ratio": 4e-5,
                    "rss_peak_kb": 200_000 + mb, "cores": 2, "ceiling": 0.86}
        runs = [run(int(mb)) for mb in _arg(step, "--sizes").split(",")]
        return {"runs": runs, "rss_ratio": runs[-1]["rss_peak_kb"] / runs[0]["rss_peak_kb"]}
    if step.bench == "scale":
        def size(points: int, report: int) -> dict:
            return {"points": points, "enqueued_s": points / 200, "per_shard_ms": 5.0, "status_s": 0.01,
                    "status_runs_s": [0.01] * 5, "dashboard_job_s": 0.09, "dashboard_job_runs_s": [0.09] * 5,
                    "report_shards": report, "report_s": report / 200}
        requests = {n: {"shards": int(n), "total": 20.0, "table": 6.0, "blob": 5.0, "queue": 9.0}
                    for n in _arg(step, "--requests").split(",")}
        return {"small": size(int(_arg(step, "--small")), int(_arg(step, "--report-small"))),
                "big": size(int(_arg(step, "--big")), int(_arg(step, "--report-big"))), "requests": requests}
    return {}


def _default_rows() -> list[dict]:
    out = []
    for step in plan.steps("default"):
        figures = _figures(step)
        if figures:
            out += rows.rows(step.bench, figures)
    return out


def test_the_default_plan_prints_every_measure_of_the_scale_table_at_two_sizes():
    made = _default_rows()
    used: set[int] = set()
    for measure, (_, pattern) in SCALE_TABLE.items():
        found = [i for i, r in enumerate(made) if re.search(pattern, r["measure"]) and i not in used]
        assert found, f"no row of the default plan shows {measure!r} (pattern {pattern!r})"
        row = made[found[0]]
        used.add(found[0])
        sizes = re.search(pattern, row["measure"]).groups()
        if len(sizes) == 2:  # a growth row: two different sizes, the ratio of the figures
            big, small = (int(s.replace(",", "")) for s in sizes)
            assert big > small, row["measure"]
            assert row["ratio"] is not None and row["figure"] and row["baseline"], row
    drop = [int(re.search(SCALE_TABLE["drop: ingest ÷ plain download"][1], r["measure"]).group(1))
            for r in made if re.search(SCALE_TABLE["drop: ingest ÷ plain download"][1], r["measure"])]
    assert len(set(drop)) == 2, drop  # ingest ÷ download at both drop sizes
    ceilings = [r for r in made if r["measure"].startswith("  its ceiling on 2 cores")]
    assert [r["ratio"] for r in ceilings] == [0.86, 0.86]  # beside each drop's ratio, what these cores allow


def test_the_scale_benches_run_once_and_the_others_repeat():
    steps = {s.bench: s for s in plan.steps("default")}
    assert {b for b, s in steps.items() if plan.runs(s, 3) == 1} == {"scale", "drop", "reconcile"}
    assert all(plan.runs(s, 3) == 3 for b, s in steps.items() if b not in ("scale", "drop", "reconcile"))
    # bench-scale runs the same benches at the sizes: larger than the default's
    big = {s.bench: s for s in plan.steps("scale")}
    assert int(_arg(big["scale"], "--big")) == 100_000 > int(_arg(steps["scale"], "--big"))
    assert _arg(big["drop"], "--sizes") == "100,1000"


def test_an_unknown_plan_or_bench_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown plan 'huge'"):
        plan.steps("huge")
    with pytest.raises(ValueError, match="plan 'scale' has no bench heat"):
        plan.steps("scale", {"heat"})
