"""What one simulated run measured (upwell.scale.poolsim), and how the runs are written out.

Measured per policy: tasks completed, makespan (first arrival to last completion), cost (node-hours
x price, until the pool is empty), idle node-minutes (booted, no task), boot
node-minutes, p95 queue wait (a task's time visible on the queue, all attempts),
work lost to kills and evictions, and cost x makespan. ``write`` puts every row in
summary.json and plots each trace's pool size against its backlog.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Result:
    """One policy's run on one trace: the measures above, and the sampled ``series`` for the plots."""

    trace: str
    policy: str
    tasks: int
    makespan_min: float
    cost_usd: float
    idle_node_min: float
    boot_node_min: float
    p95_wait_min: float
    lost_task_min: float
    evictions: int
    peak_nodes: int
    completed: int = 0
    series: dict[str, list[float]] = field(default_factory=dict, repr=False)

    @property
    def cost_x_makespan(self) -> float:
        return self.cost_usd * self.makespan_min / 60.0  # USD x hours

    def row(self) -> dict[str, Any]:
        return {"trace": self.trace, "policy": self.policy, "tasks": self.tasks, "completed": self.completed,
                "makespan_min": round(self.makespan_min, 2), "cost_usd": round(self.cost_usd, 4),
                "idle_node_min": round(self.idle_node_min, 1), "boot_node_min": round(self.boot_node_min, 1),
                "p95_wait_min": round(self.p95_wait_min, 2), "lost_task_min": round(self.lost_task_min, 1),
                "evictions": self.evictions, "peak_nodes": self.peak_nodes,
                "cost_x_makespan_usd_h": round(self.cost_x_makespan, 4)}


def plot(trace: str, results: list[Result], path: Path) -> Path:
    """Pool size and backlog over time, one panel per policy, to a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 1, figsize=(10, 2.4 * len(results)), sharex=True, squeeze=False)
    top_nodes = max(max(r.series["nodes"], default=0) for r in results) * 1.08 + 0.5
    top_backlog = max(max(r.series["backlog"], default=0) for r in results) * 1.08 + 0.5
    for ax, r in zip(axes[:, 0], results, strict=True):
        s = r.series
        ax.plot(s["t_min"], s["nodes"], color="tab:blue", label="nodes", drawstyle="steps-post")
        ax.plot(s["t_min"], s["busy"], color="tab:green", label="busy", linewidth=0.8, drawstyle="steps-post")
        ax.set_ylabel("nodes")
        ax.set_ylim(0, top_nodes)
        twin = ax.twinx()
        twin.plot(s["t_min"], s["backlog"], color="tab:orange", alpha=0.7, label="backlog", drawstyle="steps-post")
        twin.set_ylabel("backlog")
        twin.set_ylim(0, top_backlog)
        ax.set_title(f"{r.policy}: {r.makespan_min:.1f} min, ${r.cost_usd:.2f}, idle {r.idle_node_min:.0f} node-min",
                     fontsize=9, loc="left")
        lines = ax.get_lines() + twin.get_lines()
        ax.legend(lines, [ln.get_label() for ln in lines], loc="upper right", fontsize=7)
    axes[-1, 0].set_xlabel("minutes")
    fig.suptitle(f"{trace}: pool size vs backlog", fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(results: dict[str, list[Result]], out: Path, *, plots: bool = True) -> list[Path]:
    """summary.json (every row) and one PNG per trace under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    rows = [r.row() for rs in results.values() for r in rs]
    paths = [out / "summary.json"]
    paths[0].write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    if plots:
        paths += [plot(name, rs, out / f"{name}.png") for name, rs in results.items()]
    return paths
