"""Scaling policies side by side: upwell's cost x makespan over each baseline's, per trace and seed.

Runs the discrete-event simulation (upwell.scale.comparison over upwell.scale.poolsim) for every
shipped trace and several seeds, then prints, per trace, the ratio upwell / baseline of cost x
makespan (below 1: upwell better), of cost and of makespan, with the spread over
seeds. Also times ``scaling.decide`` against the bare ``scaling.target`` formula.

    .venv/bin/python bench/bench_scaling.py [--seeds 5] [--json bench/out/scaling.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from upwell.pools.base import PoolSpec
from upwell.scale import policy as scaling
from upwell.scale.clairvoyant import lower_bound
from upwell.scale.comparison import compare
from upwell.scale.traces import DEFAULT_TRACES, load_trace

BASELINES = ("batch-formula", "keda", "keda-all")


def ratios(seeds: int) -> dict:
    out: dict = {}
    for name in DEFAULT_TRACES:
        trace = load_trace(name)
        per = {b: {"cxm": [], "cost": [], "makespan": []} for b in BASELINES}
        bound: dict[str, list[float]] = {p: [] for p in ("upwell", *BASELINES)}
        for seed in range(seeds):
            rs = {r.policy: r for r in compare([trace], seed)[trace.name]}
            up = rs["upwell"]
            for b in BASELINES:
                per[b]["cxm"].append(up.cost_x_makespan / rs[b].cost_x_makespan)
                per[b]["cost"].append(up.cost_usd / rs[b].cost_usd)
                per[b]["makespan"].append(up.makespan_min / rs[b].makespan_min)
            floor = lower_bound(trace, seed).cost_x_makespan
            for p in bound:
                bound[p].append(rs[p].cost_x_makespan / floor)
        out[trace.name] = {"vs": per, "bound": bound}
    return out


def decide_rate(n: int = 20000) -> tuple[float, float]:
    spec = PoolSpec("cpu", max_nodes=50, spot_share=0.5)
    obs = scaling.Observation(visible=300, in_flight=20, nodes=20, idle=3, spot_nodes=10, price_per_node_hour=0.19,
                              budget_left_usd=50.0, quota_cores=64, cores_per_node=4, boot_s=360)
    state = scaling.PolicyState()
    t0 = time.perf_counter()
    for _ in range(n):
        state = scaling.decide(spec, obs, state).state
    t1 = time.perf_counter()
    for _ in range(n):
        scaling.target(320, 1, 0, 50)
    t2 = time.perf_counter()
    return n / (t1 - t0), n / (t2 - t1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    t0 = time.perf_counter()
    table = ratios(args.seeds)
    elapsed = time.perf_counter() - t0
    print(f"upwell / baseline over seeds 0..{args.seeds - 1} (median [min-max]); below 1 is better for upwell")
    print(f"{'trace':16s} {'baseline':14s} {'cost x makespan':>24s} {'cost':>22s} {'makespan':>22s}")
    for trace, both in table.items():
        for b, m in both["vs"].items():
            cells = [f"{statistics.median(v):.2f} [{min(v):.2f}-{max(v):.2f}]" for v in m.values()]
            print(f"{trace:16s} {b:14s} {cells[0]:>24s} {cells[1]:>22s} {cells[2]:>22s}")
    print("each policy / the clairvoyant lower bound (median [min-max]; 1 would be perfect)")
    for trace, both in table.items():
        print(f"{trace:16s} " + "  ".join(f"{p} {statistics.median(v):.2f} [{min(v):.2f}-{max(v):.2f}]"
                                          for p, v in both["bound"].items()))
    fast, bare = decide_rate()
    print(f"simulation: {3 * len(BASELINES) + 3} runs x {args.seeds} seeds in {elapsed:.1f} s")
    print(f"decide(): {fast:,.0f}/s; bare target(): {bare:,.0f}/s; ratio {fast / bare:.3f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"ratios": {t: b["vs"] for t, b in table.items()},
                                         "clairvoyant": {t: b["bound"] for t, b in table.items()},
                                         "decide_per_s": fast, "target_per_s": bare}, indent=2))


if __name__ == "__main__":
    main()
