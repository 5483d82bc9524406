"""The bench's pairing, median and spread (``bench/pairs.py``) and the table's spread rows (``bench/rows.py``):
pure functions on fixed input."""

from __future__ import annotations

import pytest

from bench import pairs, rows


def test_interleave_alternates_the_order_pair_by_pair():
    calls: list[str] = []
    base, subj = pairs.interleave(lambda: calls.append("A") or len(calls),
                                  lambda: calls.append("B") or len(calls), 4)
    assert calls == ["A", "B", "B", "A", "A", "B", "B", "A"]
    # index k of each list comes from pair k
    assert base == [1, 4, 5, 8] and subj == [2, 3, 6, 7]


def test_interleave_refuses_no_pairs():
    with pytest.raises(ValueError, match="pairs must be at least 1"):
        pairs.interleave(lambda: 1, lambda: 1, 0)


def test_the_median_pair_ratio_ignores_one_pair_caught_by_load():
    # pair 2 ran its subject while something else took the core: one ratio of 0.5, the others about 0.9
    subject, baseline = [9.0, 9.2, 5.0, 8.8, 9.1], [10.0, 10.0, 10.0, 10.0, 10.0]
    assert pairs.pair_ratios(subject, baseline) == pytest.approx([0.9, 0.92, 0.5, 0.88, 0.91])
    assert pairs.median_ratio(subject, baseline) == pytest.approx(0.9)
    # a load that halves both sides of a pair leaves its ratio alone
    assert pairs.median_ratio([9.0, 4.5, 9.0], [10.0, 5.0, 10.0]) == pytest.approx(0.9)


def test_pair_ratios_refuses_mismatched_or_empty_samples():
    with pytest.raises(ValueError, match="same number of samples"):
        pairs.pair_ratios([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="same number of samples"):
        pairs.pair_ratios([], [])
    with pytest.raises(ValueError, match="not positive"):
        pairs.pair_ratios([1.0], [0.0])


def test_spread_is_range_over_median():
    assert pairs.spread([0.97, 0.84, 0.90]) == pytest.approx((0.97 - 0.84) / 0.90)
    assert pairs.spread([0.59, 0.95]) == pytest.approx(0.36 / 0.77)
    assert pairs.spread([1.0, 1.0, 1.0]) == 0.0
    assert pairs.spread([0.5]) is None
    assert pairs.spread([0.0, 0.0]) is None


def test_repeats_for_sizes_a_sample():
    assert pairs.repeats_for(0.06, 2.5) == 42  # 0.06 s epochs: 42 make 2.5 s
    assert pairs.repeats_for(5.0, 2.0) == 1
    assert pairs.repeats_for(0.0, 2.0, cap=7) == 7
    assert pairs.repeats_for(1e-9, 2.0, cap=1000) == 1000


def test_calibrate_sizes_from_a_run_of_at_least_a_tenth_of_the_target():
    now = [0.0]
    steps = [0]

    def step():  # each step takes 0.01 s on this clock
        steps[0] += 1
        now[0] += 0.01

    reps = pairs.calibrate(step, 2.0, clock=lambda: now[0])
    assert reps == 200
    assert steps[0] == 1 + 2 + 4 + 8 + 16 + 32  # doubled until 0.32 s >= 0.2 s


def _run(ratio: float | None, value: float | None = None) -> list[dict]:
    row = {"measure": "m", "figure": f"{ratio}", "baseline": "", "ratio": ratio, "goal": ">= 0.95" if ratio else "",
           "met": None}
    return [row if value is None else {**row, "value": value}]


def test_table_rows_show_the_spread_and_flag_a_row_over_five_percent():
    stable = rows.spread([_run(0.97), _run(0.96), _run(0.98)])[0]
    assert stable["ratio"] == pytest.approx(0.97)
    assert stable["spread"] == pytest.approx(0.02 / 0.97)
    assert stable["met"] is True and stable["unstable"] is False
    noisy = rows.spread([_run(0.97), _run(0.84), _run(0.90)])[0]
    assert noisy["ratio"] == pytest.approx(0.90) and noisy["met"] is False
    assert noisy["unstable"] is True
    text = rows.render([stable, noisy], {"time": "t", "load_before": "1", "load_after": "1"})
    assert "2.1%" in text and "14.4%!" in text
    assert text.splitlines()[-1].startswith("spread over 5% between runs (!): m")


def test_rows_of_seconds_show_their_spread_with_no_ratio():
    row = rows.spread([_run(None, 1.10), _run(None, 1.20), _run(None, 1.15)])[0]
    assert row["ratio"] is None
    assert row["value"] == pytest.approx(1.15)
    assert row["spread"] == pytest.approx(0.10 / 1.15) and row["unstable"] is True


def test_latency_keeps_seconds_out_of_the_ratio_column():
    out = rows.rows("latency", {"upload_to_start_s": [0.5, 0.6, 0.7], "cold_s": 0.9})
    assert [r["ratio"] for r in out] == [None, None]
    assert [r["value"] for r in out] == [0.6, 0.9]
    assert out[0]["figure"] == "0.60 s" and out[0]["met"] is True


def test_the_high_ratio_holds_while_something_outside_moves_one_side_more():
    # a copy that loses up to half its rate to the host's other tenants, a kernel that loses a fifth as much
    loss = [0.0, 0.5, 0.1, 0.3, 0.0, 0.4, 0.2, 0.0, 0.45, 0.05]
    copy = [50 * (1 - x) for x in loss]
    kernel = [20 * (1 - x / 5) for x in loss]
    assert pairs.high_ratio(kernel, copy) == pytest.approx(0.4)
    assert pairs.median_ratio(kernel, copy) > 0.45, "the pairs' median moves with the loss"
    assert pairs.quantile([3.0, 1.0, 2.0], 0.9) == 3.0 and pairs.quantile([3.0, 1.0, 2.0], 0.5) == 2.0


def test_the_machine_rows_show_how_far_each_probe_measure_moved():
    probes = [{"python": 60.0, "start": 0.12, "copy": 26.0}, {"python": 66.0, "start": 0.11, "copy": 26.5},
              {"python": 63.0, "start": 0.13, "copy": 26.2}]
    loop, start, copy = rows.machine(probes)
    assert loop["value"] == 63.0 and loop["spread"] == pytest.approx(6 / 63) and loop["unstable"] is True
    assert start["figure"] == "0.120 s" and start["baseline"] == "[0.11–0.13]"
    assert copy["spread"] == pytest.approx(0.5 / 26.2) and copy["unstable"] is False
    assert "3 bench runs" in copy["measure"] and copy["ratio"] is None
    assert rows.machine(probes[:1]) == [], "one probe has no spread"


def test_a_probe_measures_the_machine():
    from bench import probe

    got = probe.probe()
    assert set(got) == set(probe.MEASURES)
    # a loop of 300,000 additions, an interpreter start and a 512 MiB copy each take some milliseconds
    assert 1 < got["python"] < 1000 and 0.005 < got["start"] < 10 and 0.5 < got["copy"] < 500
