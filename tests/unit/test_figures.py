"""Report sections per payload: PNG figures and tables from result documents, failed shards tolerated."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest

from upwell.results.figures import Section, sections_for
from upwell.results.figures.heat import observed_order

PNG = b"\x89PNG\r\n\x1a\n"
FAILED = {"shard_id": "broken", "payload": "x", "status": "failed", "metrics": None, "artifacts": {}}


def doc(shard: str, payload: str, params: dict, metrics: dict, artifacts: dict | None = None,
        where: str = "params") -> dict:
    d = {"shard_id": shard, "payload": payload, "status": "succeeded", "metrics": metrics,
         "artifacts": artifacts or {}}
    if where == "params":
        d["params"] = params
    else:
        d["provenance"] = {"params": params}
    return d


def npz(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


class Store(dict):
    """fetch(): a blob's bytes; a missing blob raises, as the storage adapter would."""

    def __call__(self, path: str) -> bytes:
        return self[path]


def check(sections: list[Section], figures: int, tables: int) -> None:
    assert len(sections) == 1
    s = sections[0]
    assert len(s.figures) == figures and len(s.tables) == tables, s.text
    assert all(f.png.startswith(PNG) and f.caption for f in s.figures)
    assert all(len(row) == len(t.columns) for t in s.tables for row in t.rows)


def test_logistic_bifurcation_and_lyapunov():
    results = [doc(f"s{i}", "logistic", {"r": r}, {"r": r, "lyapunov": 0.3 if r > 3.6 else -0.2,
                                                  "period": 0 if r > 3.6 else 2, "mean": 0.5,
                                                  "attractor": [0.3, 0.7]}) for i, r in enumerate((3.2, 3.9))]
    out = sections_for("logistic")(results + [FAILED], Store())
    check(out, figures=1, tables=1)
    assert "1 of 3 shards" in out[0].text and out[0].tables[0].rows[1][1] == "chaotic"


def test_channel_stats_pools_and_plots():
    stats = {"a": {"count": 10, "mean": 1.0, "std": 1.0, "min": -1.0, "max": 3.0, "missing": 0},
             "b": {"count": 0, "mean": None, "std": None, "min": None, "max": None, "missing": 10}}
    results = [doc(f"s{i}", "channel-stats", {}, {"rows": 10, "channels": ["a", "b"], "stats": stats},
                   where="provenance") for i in range(2)]
    out = sections_for("channel-stats")(results + [FAILED], Store())
    check(out, figures=1, tables=1)
    rows = {r[0]: r for r in out[0].tables[0].rows}
    assert rows["a"][1] == "20" and rows["b"][1] == "0" and rows["b"][2] == "—"


def test_welch_combines_shards_from_fetched_npz():
    freqs = np.linspace(0, 50, 129)
    store = Store()
    results = []
    for i, n in enumerate((3, 1)):
        psd = np.vstack([np.full(129, float(i + 1)), np.exp(-freqs)])
        store[f"results/j/s{i}/psd.npz"] = npz(freqs=freqs, psd=psd, n_segments=np.array([n, n]),
                                               channels=np.array(["x", "y"]))
        results.append(doc(f"s{i}", "welch", {}, {"n_segments": n}, {"psd.npz": f"results/j/s{i}/psd.npz"}))
    results.append(doc("lost", "welch", {}, {"n_segments": 2}, {"psd.npz": "results/j/lost/psd.npz"}))
    out = sections_for("welch")(results + [FAILED], store)
    check(out, figures=1, tables=1)
    assert "4 segments" in out[0].text  # 3 + 1; the unfetchable shard is left out


def heat_result(nx: int, ranks: int) -> tuple[dict, bytes, bytes]:
    x = np.arange(1, nx + 1) / (nx + 1)
    exact = np.outer(np.sin(np.pi * x), np.sin(np.pi * x)) * 0.8
    h = 1 / (nx + 1)
    u = exact + 0.1 * h * h * exact
    series = {"step": [0, 10], "t": [0.0, 0.01], "l2_norm": [0.5, 0.41], "analytic_l2_norm": [0.5, 0.41]}
    metrics = {"nx": nx, "ny": nx, "ranks": ranks, "steps": 10, "l2_error": 0.05 * h * h, "rel_l2_error": 0.1 * h * h,
               "cells_per_second": 1e7, "checkpoints_total": 2, "resumed_from_step": 5 if nx == 32 else None,
               "compute_saved_fraction": 0.5 if nx == 32 else 0.0}
    return metrics, npz(u=u, exact=exact, x=x, y=x, t=0.01), json.dumps(series).encode()


def test_heat_fields_convergence_and_analytic_comparison():
    store, results = Store(), []
    for nx in (16, 32, 64):
        metrics, field, series = heat_result(nx, ranks=2)
        base = f"results/j/n{nx}"
        store[f"{base}/field.npz"], store[f"{base}/series.json"] = field, series
        results.append(doc(f"n{nx}", "heat-mpi", {"nx": nx}, metrics,
                           {"field.npz": f"{base}/field.npz", "series.json": f"{base}/series.json"}))
    out = sections_for("heat-mpi")(results + [FAILED], store)
    # convergence + (field, analytic) for the finest + two more fields
    check(out, figures=5, tables=1)
    assert "observed order of convergence 2" in out[0].text and "1 resumed" in out[0].text
    assert len(out[0].tables[0].rows) == 3


def test_observed_order_is_the_log_log_slope():
    h = [1 / 16, 1 / 32, 1 / 64]
    assert observed_order(h, [3 * x * x for x in h]) == pytest.approx(2.0)
    assert observed_order([0.1], [0.01]) is None


def test_train_curves_and_accuracy_table():
    results = []
    for i, lr in enumerate((0.02, 0.05)):
        loss = [2.0 * math.exp(-k * (i + 1)) for k in range(5)]
        results.append(doc(f"c{i}", "train-torch", {"lr": lr, "epochs": 5},
                           {"loss": loss, "accuracy": [0.5] * 5, "test_accuracy_history": [0.6, 0.8, 0.9, 0.95, 0.97],
                            "test_accuracy": 0.97 - i / 100, "epoch": 5, "samples_per_second": 2e4,
                            "device": "cpu", "world_size": 1, "resumed_from_epoch": None}))
    out = sections_for("train-torch")(results + [FAILED], Store())
    check(out, figures=1, tables=1)
    assert out[0].tables[0].rows[0][0] == "lr=0.02" and "best test accuracy 0.97" in out[0].text
    assert out[0].tables[0].rows[0][3] == "20,000"  # samples/s, not 2e+04


def test_train_accuracy_is_curves_with_several_evaluations_and_a_dot_plot_with_one():
    """eval_every 0 (the default) evaluates after the last epoch only: lone dots at one epoch say nothing, so the
    panel becomes one row a configuration, best on top, in the colour of its loss curve."""
    from upwell.results.figures._common import new_figure
    from upwell.results.figures.train import accuracy_panel

    def run(lr, final, history):
        return doc(f"c{lr}", "train-torch", {"lr": lr}, {"loss": [1.0, 0.5], "test_accuracy": final,
                                                         "test_accuracy_history": history})

    best_first = [run(0.05, 0.9889, [0.9889]), run(0.02, 0.9711, [0.9711]), run(0.1, None, [])]
    _, ax = new_figure()
    assert accuracy_panel(ax, best_first, ["C0", "C1", "C2"], ["lr"]) is False
    assert [t.get_text() for t in ax.get_yticklabels()] == ["lr=0.02", "lr=0.05"]  # bottom to top; no value: no row
    dots = [(line.get_xdata()[0], line.get_ydata()[0], line.get_color()) for line in ax.get_lines()]
    assert dots == [(0.9711, 0, "C1"), (0.9889, 1, "C0")]
    assert sorted(t.get_text() for t in ax.texts) == ["0.9711", "0.9889"]
    _, ax = new_figure()
    assert accuracy_panel(ax, [run(0.05, 0.99, [0.9, 0.99])], ["C0"], ["lr"]) is True
    assert list(ax.get_lines()[0].get_xdata()) == [1, 2] and ax.get_xlabel() == "epoch"
    out = sections_for("train-torch")(best_first[:2], Store())
    assert out[0].figures[0].caption.endswith("test accuracy per configuration at its last epoch")


@pytest.mark.parametrize("payload", ["logistic", "channel-stats", "welch", "heat-mpi", "train-torch"])
def test_only_failed_shards_give_a_text_section(payload):
    out = sections_for(payload)([FAILED, {"shard_id": "odd", "metrics": {}}], Store())
    assert len(out) == 1 and not out[0].figures and out[0].text
