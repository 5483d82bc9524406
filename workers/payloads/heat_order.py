"""The heat sweep's reduce: the observed order of accuracy, a least-squares fit of log(L2 error) against
log(grid spacing h = 1/(nx+1), nx interior points) over every succeeded shard of the sweep, and its log-log plot.

Run by the ``heat-order`` definition (payloads/heat-order.yaml) as
``python -m workers.payloads.heat_order --input <folder of result JSONs> --out <folder>``. Writes
``summary.json`` (``order``, ``order_error`` = |order - 2|, ``points``, the fit's ``intercept``) and
``convergence.png``. Exit 65 (unusable input) when fewer than two distinct grids succeeded.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

EXIT_OK, EXIT_BAD_INPUT = 0, 65


def points(folder: Path) -> list[tuple[float, float]]:
    """(h, L2 error) of each succeeded heat result in ``folder``, sorted by h."""
    out = []
    for path in sorted(folder.glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict) or doc.get("status") != "succeeded":
            continue
        nx = (doc.get("params") or {}).get("nx")
        err = (doc.get("metrics") or {}).get("l2_error")
        if isinstance(nx, int | float) and nx > 1 and isinstance(err, int | float) and err > 0:
            out.append((1.0 / (float(nx) + 1.0), float(err)))
    return sorted(out)


def fit(pts: list[tuple[float, float]]) -> tuple[float, float]:
    """Slope and intercept of log(error) = slope * log(h) + intercept."""
    x = np.log([h for h, _ in pts])
    y = np.log([e for _, e in pts])
    slope, intercept = np.polyfit(x, y, 1)
    return float(slope), float(intercept)


def plot(pts: list[tuple[float, float]], slope: float, intercept: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h = np.array([p[0] for p in pts])
    fig, ax = plt.subplots(figsize=(6, 4.2), dpi=110)
    ax.loglog(h, [p[1] for p in pts], "o", label="L2 error, one per grid")
    ax.loglog(h, np.exp(intercept) * h ** slope, "-", label=f"fit: slope {slope:.3f}")
    ax.loglog(h, pts[-1][1] * (h / h[-1]) ** 2, "--", color="grey", label="slope 2")
    ax.set(xlabel="grid spacing h", ylabel="L2 error", title=f"Observed order of accuracy {slope:.3f}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="heat_order", description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    pts = points(args.input)
    if len({h for h, _ in pts}) < 2:
        print(f"heat_order: {len(pts)} usable result(s) in {args.input}; a fit needs two grids", file=sys.stderr)
        return EXIT_BAD_INPUT
    slope, intercept = fit(pts)
    args.out.mkdir(parents=True, exist_ok=True)
    plot(pts, slope, intercept, args.out / "convergence.png")
    summary = {"order": round(slope, 6), "order_error": round(abs(slope - 2.0), 6), "points": len(pts),
               "intercept": round(intercept, 6), "finest_h": pts[0][0], "finest_l2_error": pts[0][1]}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"observed order of accuracy {slope:.4f} over {len(pts)} grids")
    return EXIT_OK if math.isfinite(slope) else EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
