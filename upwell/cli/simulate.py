"""``upwell simulate``: upwell's scaling policy against Batch's formula and KEDA on workload traces."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

console = Console()


def simulate(
    traces: list[str] = typer.Argument(None, help="trace JSON files or shipped names (default: all in "
                                                  "samples/traces: burst, trickle, instrument-day)"),
    seed: int = typer.Option(0, help="seed for arrivals, boot delays, evictions and Batch's evaluation phase"),
    out: Path = typer.Option(Path(".upwell/simulate"), help="folder for summary.json and one PNG per trace"),
    pool_max: int = typer.Option(None, "--pool-max", help="override every trace's max nodes"),
    spot_share: float = typer.Option(None, "--spot-share", help="override every trace's spot share (0..1)"),
    policy: list[str] = typer.Option(None, "--policy", "-p", help="policies to run (repeatable); default: "
                                                                  "upwell, batch-formula, keda, keda-all"),
    keda_linger_min: float = typer.Option(10.0, help="minutes a Kubernetes node stays after its pod went "
                                                     "(cluster-autoscaler scale-down-unneeded-time)"),
    plots: bool = typer.Option(True, "--plots/--no-plots", help="write pool size vs backlog plots"),
    backend: str = typer.Option(None, "--backend", help="cloud (nodes boot for the trace's delay) or slurm "
                                                      "(agents are jobs on a fixed cluster of --pool-max "
                                                      "nodes: no boot); default: each trace's own"),
) -> None:
    """Simulate a pool under workload traces and compare scaling policies side by side."""
    from upwell.errors import UpwellError
    from upwell.scale.baselines import DEFAULT_POLICIES
    from upwell.scale.clairvoyant import lower_bound
    from upwell.scale.comparison import compare
    from upwell.scale.sim_results import write
    from upwell.scale.traces import DEFAULT_TRACES, load_trace

    try:
        loaded = [load_trace(t) for t in (traces or DEFAULT_TRACES)]
        results = compare(loaded, seed, tuple(policy or DEFAULT_POLICIES), max_nodes=pool_max,
                          spot_share=spot_share, linger_s=keda_linger_min * 60, backend=backend)
    except UpwellError as exc:
        console.print(f"[red]error[/] {exc}")
        raise typer.Exit(2) from None
    for trace in loaded:
        console.print(table(trace, results[trace.name], seed, backend, lower_bound(trace, seed, backend)))
    paths = write(results, out, plots=plots)
    console.print(f"wrote {', '.join(str(p) for p in paths)}")


def table(trace, results, seed: int, backend: str | None = None, bound=None) -> Table:
    """One trace's results; the lowest cost x makespan (USD x hours) in green; each policy's ratio to the
    clairvoyant lower bound (upwell.scale.clairvoyant.lower_bound) in the last column."""
    best = min(r.cost_x_makespan for r in results)
    caption = trace.description
    if bound is not None:
        caption += (f"\nclairvoyant lower bound: ${bound.cost_usd:.2f} (task time at the cheapest allowed mix), "
                    f"makespan {bound.makespan_min:.1f} min, cost x makespan {bound.cost_x_makespan:.2f}")
    t = Table(title=f"{trace.name} (seed {seed}): {results[0].tasks} tasks, at most {trace.max_nodes} nodes, "
                    f"spot share {trace.spot_share:g}{', ' + backend if backend else ''}",
              caption=caption, caption_justify="left")
    for col in ("policy", "done", "makespan\nmin", "cost\n$", "idle\nnode-min", "boot\nnode-min", "p95 wait\nmin",
                "lost\ntask-min", "evic-\ntions", "cost x\nmakespan", "÷ bound"):
        t.add_column(col, justify="left" if col == "policy" else "right", no_wrap=col == "policy")
    for r in results:
        mark = "[bold green]" if r.cost_x_makespan == best else ""
        ratio = f"{r.cost_x_makespan / bound.cost_x_makespan:.2f}" if bound and bound.cost_x_makespan else "-"
        t.add_row(r.policy, f"{r.completed}", f"{r.makespan_min:.1f}", f"{r.cost_usd:.2f}", f"{r.idle_node_min:.0f}",
                  f"{r.boot_node_min:.0f}", f"{r.p95_wait_min:.1f}", f"{r.lost_task_min:.1f}", str(r.evictions),
                  f"{mark}{r.cost_x_makespan:.2f}", ratio)
    return t


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate)
