"""Workload traces for the pool simulation (upwell.scale.poolsim): the JSON format, and a trace
expanded into tasks with a seed.

A trace names a workload and the pool it runs on (samples/traces/*.json): ``arrivals`` is a list of
groups, each a burst (``at_min``, ``count``, optional ``jitter_min`` and ``spread_min``), a Poisson
stream (``per_min`` from ``from_min`` to ``to_min``) or periodic drops (``every_min``, ``times``), with a
mean ``duration_min`` and its coefficient of variation ``cv``, and the ``nodes`` each of its tasks holds at
once (a gang, default 1: upwell.shape); ``pool`` and ``boot_minutes`` set the pool. The same trace and seed
always expand to the same tasks.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from upwell import REPO
from upwell.errors import ConfigError

TRACES_DIR = REPO / "samples" / "traces"
DEFAULT_TRACES = ("burst.json", "trickle.json", "instrument-day.json")


@dataclass(frozen=True)
class Trace:
    """A workload and the pool it runs on; ``arrivals`` are expanded with the seed."""

    name: str
    description: str
    arrivals: tuple[dict, ...]
    max_nodes: int = 20
    tasks_per_node: int = 1
    spot_share: float = 0.0
    price_key: str = "Standard_D4s_v5"
    price_per_node_hour: float | None = None
    spot_price_per_node_hour: float | None = None
    boot_median_min: float = 6.0
    boot_sigma: float = 0.5
    boot_min_min: float = 3.0
    boot_max_min: float = 30.0
    evictions_per_spot_node_hour: float = 0.0
    checkpoint_min: float = 0.0  # 0: a task restarts from scratch
    budget_usd: float | None = None
    # "cloud": a node boots for the drawn delay before it takes work. "slurm": an agent is a job on a
    # fixed cluster of max_nodes nodes that are already up, so it starts at once (no boot cost).
    backend: str = "cloud"

    def prices(self) -> tuple[float, float]:
        """(dedicated, spot) USD per node-hour: the trace's own, else the price table's for ``price_key``."""
        if self.price_per_node_hour is not None:
            p = float(self.price_per_node_hour)
            return p, float(self.spot_price_per_node_hour if self.spot_price_per_node_hour is not None else p)
        from upwell import cost

        return cost.price(self.price_key), cost.price(self.price_key, spot=True)


def load_trace(path: str | Path) -> Trace:
    """Read a trace JSON file; a bare name is looked up in samples/traces/."""
    p = Path(path)
    if not p.exists() and (TRACES_DIR / p.name).exists():
        p = TRACES_DIR / p.name
    if not p.exists() and (TRACES_DIR / f"{p.name}.json").exists():
        p = TRACES_DIR / f"{p.name}.json"
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"trace {str(path)!r} not found (shipped: {sorted(DEFAULT_TRACES)})") from None
    except ValueError as exc:
        raise ConfigError(f"trace {p}: not valid JSON: {exc}") from None
    pool = dict(data.get("pool") or {})
    boot = dict(data.get("boot_minutes") or {})
    known = set(Trace.__dataclass_fields__)
    fields = {k: v for k, v in pool.items() if k in known}
    fields.update({f"boot_{k}_min" if k in ("median", "min", "max") else f"boot_{k}": v for k, v in boot.items()})
    for key in ("evictions_per_spot_node_hour", "checkpoint_min", "budget_usd"):
        if key in data:
            fields[key] = data[key]
    return Trace(name=str(data.get("name") or p.stem), description=str(data.get("description", "")),
                 arrivals=tuple(data.get("arrivals") or ()), **fields)


def estimate_s(trace: Trace) -> float | None:
    """The per-task estimate ingest would write on the job rows (what upwell.cost.forecast learns from earlier
    results of the same payload): the mean duration of the trace's arrival groups, weighted by their counts
    (one node's seconds: a gang's node time is this times its nodes)."""
    total = weight = 0.0
    for group in trace.arrivals:
        if "per_min" in group:
            n = float(group["per_min"]) * (float(group["to_min"]) - float(group.get("from_min", 0)))
        else:
            n = float(group.get("count", 0)) * float(group.get("times", 1))
        total += n * float(group.get("duration_min", 1.0)) * 60
        weight += n
    return total / weight if weight > 0 else None


def expand(trace: Trace, seed: int) -> list[tuple[float, float, int]]:
    """(arrival s, duration s, nodes) of every task, sorted; the same for a seed (the nodes draw nothing)."""
    rng = random.Random(f"{trace.name}-tasks-{seed}")
    tasks: list[tuple[float, float, int]] = []
    for group in trace.arrivals:
        dur, cv = float(group.get("duration_min", 1.0)) * 60, float(group.get("cv", 0.0))
        nodes = int(group.get("nodes", 1))
        if not 1 <= nodes <= trace.max_nodes:
            raise ConfigError(f"trace {trace.name}: an arrival group's nodes must be 1 to max_nodes "
                              f"({trace.max_nodes}), got {nodes}: a larger gang would never start")
        times = _arrival_times(group, rng)
        tasks += [(t, _duration(dur, cv, rng), nodes) for t in times]
    return sorted(tasks)


def _arrival_times(group: dict, rng: random.Random) -> list[float]:
    if "at_min" in group:
        jitter = float(group.get("jitter_min", 0.0)) * 60
        start = float(group["at_min"]) * 60 + (rng.uniform(-jitter, jitter) if jitter else 0.0)
        spread = float(group.get("spread_min", 0.0)) * 60
        return [max(start + (rng.uniform(0, spread) if spread else 0.0), 0.0) for _ in range(int(group["count"]))]
    if "per_min" in group:
        t, end, rate = float(group.get("from_min", 0)) * 60, float(group["to_min"]) * 60, float(group["per_min"]) / 60
        out = []
        while True:
            t += rng.expovariate(rate)
            if t >= end:
                return out
            out.append(t)
    if "every_min" in group:  # periodic drops of `count` files
        out = []
        for k in range(int(group["times"])):
            sub = {**group, "at_min": float(group.get("from_min", 0)) + k * float(group["every_min"])}
            sub.pop("every_min")
            out += _arrival_times(sub, rng)
        return out
    raise ConfigError(f"arrival group needs at_min, per_min or every_min: {group}")


def _duration(mean_s: float, cv: float, rng: random.Random) -> float:
    if cv <= 0:
        return mean_s
    sigma = math.sqrt(math.log(1 + cv * cv))
    return mean_s * math.exp(rng.gauss(-sigma * sigma / 2, sigma))
