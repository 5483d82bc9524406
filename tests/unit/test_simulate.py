"""The scaling simulation: determinism, the model's invariants, the baselines' rules, the CLI."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from upwell.scale.baselines import BatchFormulaPolicy, KedaPolicy, make_policy, pool_spec
from upwell.scale.comparison import compare, run
from upwell.scale.poolsim import Draws, Sim
from upwell.scale.traces import DEFAULT_TRACES, Trace, estimate_s, expand, load_trace


def trace(**kw) -> Trace:
    base = Trace(name="t", description="", arrivals=({"at_min": 0, "count": 20, "duration_min": 2},),
                 max_nodes=5, price_per_node_hour=1.0, spot_price_per_node_hour=0.2, boot_median_min=3,
                 boot_sigma=0.0, boot_min_min=3, boot_max_min=3)
    return replace(base, **kw)


def test_shipped_traces_run_deterministically():
    """How long the shipped traces take is a benchmark's figure (bench/bench_scaling.py prints the seconds
    of every trace x policy run), not a bound here: a busy machine must not fail a correct simulation."""
    traces = [load_trace(t) for t in DEFAULT_TRACES]
    first = compare(traces, seed=3)
    again = compare(traces, seed=3)
    assert [r.row() for rs in first.values() for r in rs] == [r.row() for rs in again.values() for r in rs]
    other = compare(traces[:1], seed=4)
    assert [r.row() for r in other["burst"]] != [r.row() for r in first["burst"]]


@pytest.mark.parametrize("name", DEFAULT_TRACES)
def test_every_task_completes_and_the_pool_empties(name):
    t = load_trace(name)
    n = len(expand(t, 0))
    for policy in ("upwell", "batch-formula", "keda", "keda-all"):
        r = run(t, policy, 0)
        assert r.tasks == r.completed == n and r.makespan_min > 0 and r.cost_usd > 0
        # The last sample may precede the final removal: its nodes are busy ones, and at most one kept warm.
        assert r.series["nodes"][-1] - r.series["busy"][-1] <= 1
        assert r.peak_nodes <= t.max_nodes


def test_expand_shapes():
    assert len(expand(load_trace("burst"), 0)) == 500
    day = expand(load_trace("instrument-day"), 0)
    assert len(day) == 480 and max(a for a, _, _ in day) < 25 * 3600
    trickle = expand(load_trace("trickle"), 0)
    assert 120 < len(trickle) < 260  # Poisson, 0.5 a minute for 6 h
    with pytest.raises(Exception, match="at_min, per_min or every_min"):
        expand(trace(arrivals=({"count": 1},)), 0)


def test_upwell_and_batch_never_lose_work_without_evictions():
    t = trace(arrivals=({"at_min": 0, "count": 30, "duration_min": 6},
                        {"per_min": 0.5, "from_min": 10, "to_min": 60, "duration_min": 6}))
    for policy in ("upwell", "batch-formula"):
        assert run(t, policy, 1).lost_task_min == 0


def test_keda_visible_only_kills_running_work_on_long_tasks():
    """In-flight messages are invisible to Peek: with long tasks the HPA scales in under running work."""
    t = trace(arrivals=({"at_min": 0, "count": 5, "duration_min": 30},))
    r = run(t, "keda", 0)
    assert r.lost_task_min > 0
    assert run(t, "keda-all", 0).lost_task_min == 0
    assert run(t, "upwell", 0).lost_task_min == 0


def test_costs_follow_prices_and_boot_is_billed():
    t = trace(arrivals=({"at_min": 0, "count": 1, "duration_min": 10},), max_nodes=1)
    r = run(t, "upwell", 0)
    # one node: 3 min boot + 10 min task + the warm minutes before going to zero, at $1/h
    assert r.boot_node_min == pytest.approx(3)
    assert r.cost_usd == pytest.approx((3 + 10 + r.idle_node_min) / 60, rel=0.05)
    spot = run(replace(t, spot_share=1.0), "upwell", 0)
    assert spot.cost_usd == pytest.approx(r.cost_usd * 0.2, rel=0.05)


def test_evictions_requeue_from_the_last_checkpoint():
    t = trace(arrivals=({"at_min": 0, "count": 10, "duration_min": 20},), spot_share=1.0,
              evictions_per_spot_node_hour=2.0, checkpoint_min=5)
    r = run(t, "upwell", 0)
    assert r.evictions > 0 and r.tasks == 10
    assert 0 < r.lost_task_min < r.evictions * 5.01  # at most one checkpoint interval lost per eviction
    no_ckpt = run(replace(t, checkpoint_min=0), "upwell", 0)
    assert no_ckpt.lost_task_min > r.lost_task_min


def test_upwell_budget_caps_spend():
    t = trace(arrivals=({"at_min": 0, "count": 40, "duration_min": 5},), max_nodes=20, budget_usd=0.5)
    capped = run(t, "upwell", 0)
    free = run(replace(t, budget_usd=None), "upwell", 0)
    assert capped.peak_nodes < free.peak_nodes and capped.completed < free.completed == 40
    # Spend stops near the budget: running tasks finish (a few minutes of a few nodes), nothing new starts.
    assert capped.cost_usd <= 0.5 + capped.peak_nodes * 5 / 60
    assert free.cost_usd > 1.0


class FakeSim:
    def __init__(self):
        self.now, self.visible, self.busy = 0.0, 0, 0

    def view(self):
        return SimpleNamespace(visible=self.visible, busy=self.busy, alive=0, booting=0, spot=0)


def test_batch_formula_rules():
    p = BatchFormulaPolicy(pool_spec("b", max_nodes=50), seed=0)
    s = FakeSim()
    for t in range(0, 301, 30):
        s.now, s.visible = float(t), 100
        p.sample(s)
    assert p.evaluate(s).total == 50  # max(last, avg) capped
    s.visible = 0
    for t in range(330, 700, 30):
        s.now = float(t)
        p.sample(s)
    assert p.evaluate(s).total == 25  # no pending tasks: half the current target
    assert p.evaluate(s).total == 12 and p.evaluate(s).mode == "taskcompletion"
    fresh = BatchFormulaPolicy(pool_spec("b", max_nodes=50))
    assert 0 <= fresh.first_eval_s < 300


def test_keda_rules():
    p = KedaPolicy(pool_spec("k", max_nodes=50), strategy="visibleonly")
    s = FakeSim()
    s.visible = 40
    assert p.evaluate(s).total == 1  # activation 0 -> 1
    s.now = 15
    assert p.evaluate(s).total == 5  # scale-up limit: max(2x, +4)
    s.now, s.visible, s.busy = 30, 10, 30  # fewer than 32 visible: Peek, in-flight invisible
    assert p.evaluate(s).total == 10 and p.metric == 10
    s.now, s.visible = 60, 2
    assert p.evaluate(s).total == 10 and p.metric == 2  # stabilization: the window's highest recommendation
    s.now, s.visible = 400, 0  # no activity since t=60 for more than cooldownPeriod: to zero, busy or not
    plan = p.evaluate(s)
    assert plan.total == 0 and plan.mode == "kill"
    q = KedaPolicy(pool_spec("k", max_nodes=50), strategy="all")
    q.evaluate(s)
    s.visible, s.busy = 10, 30
    s.now = 900
    q.evaluate(s)
    assert q.metric == 40


def test_cli_prints_tables_and_writes_plots(tmp_path):
    from upwell.cli import app

    out = tmp_path / "sim"
    res = CliRunner().invoke(app, ["simulate", "burst", "--seed", "1", "--out", str(out), "--pool-max", "20",
                                   "-p", "upwell", "-p", "batch-formula"], env={"COLUMNS": "160"})
    assert res.exit_code == 0, res.output
    assert "burst (seed 1)" in res.output and "batch-formula" in res.output and "keda" not in res.output
    rows = json.loads((out / "summary.json").read_text())
    assert {r["policy"] for r in rows} == {"upwell", "batch-formula"} and rows[0]["tasks"] == 500
    assert (out / "burst.png").stat().st_size > 10_000
    bad = CliRunner().invoke(app, ["simulate", "no-such-trace", "--out", str(out)])
    assert bad.exit_code == 2 and "not found" in bad.output


def test_upwell_sees_only_what_the_ledger_would_show():
    """The policy's view of the arrivals is the active jobs' rows: tasks arrived after the watermark and not yet
    done; the task time is the per-shard estimate ingest writes (the trace's mean), not the observed durations."""
    t = trace(arrivals=({"at_min": 0, "count": 3, "duration_min": 2}, {"at_min": 10, "count": 2, "duration_min": 8}))
    assert estimate_s(t) == pytest.approx((3 * 2 + 2 * 8) / 5 * 60)
    s = Sim(t, make_policy("upwell", pool_spec("t", max_nodes=5), 0), expand(t, 0), Draws(t, 0))
    s.now = 5 * 60.0
    assert s.active_arrivals(None) == ((0.0, 1),) * 3  # nothing done yet (the pool is still booting)
    s.tasks[0].end = 4 * 60.0
    assert s.active_arrivals(None) == ((0.0, 1),) * 2  # a finished job is no longer active
    s.now = 11 * 60.0
    assert s.active_arrivals(0.0) == ((600.0, 1),) * 2  # only the arrivals past the watermark, none in the future


def test_the_ingest_nudge_evaluates_on_arrival():
    """With UPWELL_SCALE_ON_INGEST the scale pass runs when ingest accepts a job: a node is asked for at the
    arrival, not at the next timer tick; without it the first node waits for the tick."""
    t = trace(arrivals=({"at_min": 0.2, "count": 1, "duration_min": 2},), max_nodes=1)
    on = Sim(t, make_policy("upwell", pool_spec("t", max_nodes=1), 0), expand(t, 0), Draws(t, 0))
    on.run(10 * 3600)
    assert on.nodes[0].requested == pytest.approx(12.0)
    policy = make_policy("upwell", pool_spec("t", max_nodes=1), 0)
    policy.on_arrival = False
    off = Sim(t, policy, expand(t, 0), Draws(t, 0))
    off.run(10 * 3600)
    assert off.nodes[0].requested == pytest.approx(30.0)


def test_upwell_learns_the_arrivals_in_its_state():
    """The simulated policy carries what it learned in PolicyState only (what the Autoscaler persists)."""
    t = load_trace("instrument-day")
    policy = make_policy("upwell", pool_spec(t.name, max_nodes=20, spot_share=0.5), 0)
    Sim(t, policy, expand(t, 0), Draws(t, 0)).run(48 * 3600)
    st = policy.state
    assert 100 * 60 < st.episode_gap_s < 140 * 60  # drops every two hours, +/- 20 min
    assert st.gap_s < 60  # 40 files over five minutes
