"""Helpers the payload figure modules share: reading result documents defensively, and PNGs.

A result document may lack metrics (a failed shard), keep its parameters under
``params`` or ``provenance.params``, and name artifacts as a dict (name -> blob
path) or a list of blob paths. Nothing here raises on a malformed document.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterable
from typing import Any

from upwell.results.figures import Fetch, Figure


def params_of(doc: dict) -> dict[str, Any]:
    for source in (doc.get("params"), (doc.get("provenance") or {}).get("params")):
        if isinstance(source, dict) and source:
            return source
    return {}


def metrics_of(doc: dict) -> dict[str, Any] | None:
    metrics = doc.get("metrics")
    return metrics if isinstance(metrics, dict) and metrics else None


def succeeded(results: Iterable[dict]) -> list[dict]:
    """The documents that have metrics and did not fail."""
    return [d for d in results if isinstance(d, dict) and metrics_of(d) is not None
            and d.get("status", "succeeded") == "succeeded"]


def missing_note(results: list[dict], ok: list[dict]) -> str:
    """How many of ``results`` are not among ``ok`` (a subset of them), with the first ten ids."""
    kept = {id(d) for d in ok}  # by identity: ``d not in ok`` compared whole documents, O(n²) in the shards
    missing = [str(d.get("shard_id", "?")) for d in results if id(d) not in kept]
    if not missing:
        return ""
    shown = ", ".join(missing[:10]) + (" …" if len(missing) > 10 else "")
    return f"{len(missing)} of {len(results)} shards have no usable metrics and are left out ({shown})."


def artifact_path(doc: dict, name: str) -> str | None:
    arts = doc.get("artifacts") or {}
    pairs = arts.items() if isinstance(arts, dict) else ((a, a) for a in arts if isinstance(a, str))
    for key, path in pairs:
        if isinstance(path, str) and (key == name or str(key).endswith("/" + name) or path.endswith("/" + name)):
            return path
    return None


def fetch_artifact(doc: dict, name: str, fetch: Fetch) -> bytes | None:
    """An artifact's bytes, or None when it is not listed or cannot be fetched."""
    path = artifact_path(doc, name)
    if path is None:
        return None
    try:
        return fetch(path)
    except Exception:  # noqa: BLE001 - fetch is the caller's (storage or a test): any failure loses one picture, not the report
        return None


def fetch_json(doc: dict, name: str, fetch: Fetch) -> Any:
    data = fetch_artifact(doc, name, fetch)
    try:
        return json.loads(data) if data else None
    except ValueError:
        return None


def number(value: Any) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def fmt(value: Any, digits: int = 4) -> str:
    x = number(value)
    if x is None:
        return "—" if value is None else str(value)
    if isinstance(value, int) or (x.is_integer() and abs(x) < 1e15 and not isinstance(value, float)):
        return str(int(x))
    return f"{x:.{digits}g}"


def varying(docs: list[dict]) -> list[str]:
    """Parameter names whose values differ between documents: what tells configurations apart."""
    keys: set[str] = set().union(*(params_of(d).keys() for d in docs)) if docs else set()
    return sorted(k for k in keys if len({json.dumps(params_of(d).get(k), sort_keys=True) for d in docs}) > 1)


def label(doc: dict, keys: list[str]) -> str:
    p = params_of(doc)
    return ", ".join(f"{k}={p.get(k)}" for k in keys) or str(doc.get("shard_id", "run"))


def new_figure(width: float = 6.4, height: float = 4.0, ncols: int = 1):
    """A Figure on the Agg canvas, without pyplot's global state (safe in a host process)."""
    from matplotlib.figure import Figure as MplFigure

    fig = MplFigure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(1, ncols)
    return fig, axes


def to_png(fig, caption: str) -> Figure:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    return Figure(caption=caption, png=buffer.getvalue())
