"""Report section for the 2-D heat equation: fields, L2 error against grid size, and the analytic check.

Figures: the computed temperature field and its error map for up to three of
the finest grids; the L2 error against h on log-log axes with the observed
order of convergence and a slope-2 guide; the centre-line profile and the norm
decay of the finest run against the analytic solution. A table lists every
shard with its checkpoint and resume figures (compute saved by resuming).
"""

from __future__ import annotations

import io
import math

import numpy as np

from upwell.results.figures import Fetch, Figure, Section, Table
from upwell.results.figures._common import (
    fetch_artifact,
    fetch_json,
    fmt,
    metrics_of,
    missing_note,
    new_figure,
    number,
    succeeded,
    to_png,
)

MAX_FIELDS = 3


def observed_order(h: list[float], err: list[float]) -> float | None:
    """Least-squares slope of log(error) against log(h); None with fewer than two distinct grids."""
    pairs = [(math.log(a), math.log(b)) for a, b in zip(h, err, strict=True) if a > 0 and b and b > 0]
    if len({p[0] for p in pairs}) < 2:
        return None
    x, y = np.array(pairs).T
    return float(np.polyfit(x, y, 1)[0])


def _h(m: dict) -> float | None:
    nx, ny = number(m.get("nx")), number(m.get("ny")) or number(m.get("nx"))
    return 1.0 / (max(nx, ny) + 1) if nx and ny else None


def convergence(ok: list[dict]) -> tuple[Figure | None, float | None]:
    points = sorted((_h(m), number(m.get("l2_error")), m.get("ranks")) for m in map(metrics_of, ok)
                    if _h(m) and number(m.get("l2_error")))
    if not points:
        return None, None
    h, err = [p[0] for p in points], [p[1] for p in points]
    order = observed_order(h, err)
    fig, ax = new_figure(6, 4.2)
    ax.loglog(h, err, "o-", label="computed")
    ax.loglog(h, [err[-1] * (x / h[-1]) ** 2 for x in h], "--", color="grey", label="slope 2")
    ax.set(xlabel="grid spacing h", ylabel="L2 error vs analytic",
           title=f"Convergence (observed order {fmt(order, 3)})")
    ax.legend()
    return to_png(fig, "L2 error against grid spacing, with a second-order guide"), order


def field_figures(ok: list[dict], fetch: Fetch) -> list[Figure]:
    finest = sorted(ok, key=lambda d: -(number(metrics_of(d).get("nx")) or 0))
    figures, fields = [], 0
    for doc in finest:
        if fields >= MAX_FIELDS:
            break
        data = fetch_artifact(doc, "field.npz", fetch)
        if data is None:
            continue
        with np.load(io.BytesIO(data)) as f:
            u, exact, t = np.array(f["u"]), np.array(f["exact"]), float(f["t"])
        fig, (left, right) = new_figure(10, 4, ncols=2)
        image = left.imshow(u.T, origin="lower", extent=(0, 1, 0, 1), cmap="inferno")
        fig.colorbar(image, ax=left, label="u")
        left.set(title=f"u at t = {t:.4g} ({u.shape[0]}x{u.shape[1]})", xlabel="x", ylabel="y")
        error = right.imshow((u - exact).T, origin="lower", extent=(0, 1, 0, 1), cmap="coolwarm")
        fig.colorbar(error, ax=right, label="u − exact")
        right.set(title="error against the analytic solution", xlabel="x")
        figures.append(to_png(fig, f"Temperature field and error, shard {doc.get('shard_id', '?')}"))
        fields += 1
        if fields == 1:
            figures.append(_analytic(doc, u, exact, fetch))
    return figures


def _analytic(doc: dict, u: np.ndarray, exact: np.ndarray, fetch: Fetch) -> Figure:
    fig, (left, right) = new_figure(10, 3.8, ncols=2)
    mid = u.shape[1] // 2
    x = np.arange(1, u.shape[0] + 1) / (u.shape[0] + 1)
    left.plot(x, u[:, mid], label="computed")
    left.plot(x, exact[:, mid], "--", label="analytic")
    left.set(title="centre line y ≈ 0.5", xlabel="x", ylabel="u")
    left.legend()
    series = fetch_json(doc, "series.json", fetch) or {}
    if series.get("t"):
        right.plot(series["t"], series["l2_norm"], label="computed")
        right.plot(series["t"], series["analytic_l2_norm"], "--", label="analytic")
        right.legend()
    right.set(title="L2 norm decay", xlabel="t", ylabel="‖u‖₂")
    return to_png(fig, "Finest grid against the analytic solution exp(−απ²(m²+n²)t)·u0")


def sections(results: list[dict], fetch: Fetch) -> list[Section]:
    ok = sorted(succeeded(results), key=lambda d: (number(metrics_of(d).get("nx")) or 0, str(d.get("shard_id"))))
    note = missing_note(results, ok)
    if not ok:
        return [Section("Heat equation", text=note or "No shard produced metrics.")]
    cols = ["shard", "nx", "ny", "ranks", "steps", "l2_error", "rel_l2_error", "cells/s", "checkpoints",
            "resumed from step", "compute saved"]
    rows = [[str(d.get("shard_id", "")), *(fmt(metrics_of(d).get(k)) for k in (
        "nx", "ny", "ranks", "steps", "l2_error", "rel_l2_error", "cells_per_second", "checkpoints_total",
        "resumed_from_step")), f"{100 * (number(metrics_of(d).get('compute_saved_fraction')) or 0):.0f} %"]
        for d in ok]
    conv, order = convergence(ok)
    figures = ([conv] if conv else []) + field_figures(ok, fetch)
    resumed = sum(1 for d in ok if metrics_of(d).get("resumed_from_step"))
    text = (f"{len(ok)} runs; observed order of convergence {fmt(order, 3)} (2 expected). "
            f"{resumed} resumed from a checkpoint. {note}").strip()
    return [Section("Heat equation", text=text, figures=figures,
                    tables=[Table("Runs: accuracy, throughput and checkpoints", cols, rows)])]
