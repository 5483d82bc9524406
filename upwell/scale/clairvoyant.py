"""The clairvoyant lower bound on a trace: what no scaling policy can beat (see ``Bound``)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from upwell.scale.traces import Trace, expand


@dataclass(frozen=True)
class Bound:
    """A clairvoyant lower bound on one trace and seed: no policy, even one that knows every arrival and
    duration in advance, pays less or finishes sooner, so none has a lower cost x makespan.

    cost >= the task node time (a gang's time x its nodes) at the cheapest mix the pool allows (the spot
    share at the spot price; no boot, no idle node, no eviction). The pool is empty at time 0 and the fastest boot takes
    ``boot_min_min``, so no task starts before it: makespan >= each task's max(arrival, fastest boot) +
    duration, and >= the fastest boot + all task time spread over every slot (less the first arrival).
    The two floors need not be reached by one schedule, so the bound may be below every real policy."""

    trace: str
    cost_usd: float
    makespan_min: float

    @property
    def cost_x_makespan(self) -> float:
        return self.cost_usd * self.makespan_min / 60.0


def lower_bound(trace: Trace, seed: int = 0, backend: str | None = None) -> Bound:
    """See ``Bound``. On a Slurm cluster (``backend`` or the trace's) no boot is billed or waited for."""
    if backend is not None:
        trace = replace(trace, backend=backend)
    tasks = expand(trace, seed)
    if not tasks:
        return Bound(trace.name, 0.0, 0.0)
    price, spot_price = trace.prices()
    share = min(max(trace.spot_share, 0.0), 1.0)
    work_h = sum(d * k for _, d, k in tasks) / 3600  # node-hours: a gang holds its k nodes throughout
    cost = work_h * (share * min(spot_price, price) + (1 - share) * price)
    first, boot = tasks[0][0], (0.0 if trace.backend == "slurm" else trace.boot_min_min * 60)
    slots = max(trace.max_nodes * max(trace.tasks_per_node, 1), 1)
    last = max(max(max(a, boot) + d for a, d, _ in tasks), boot + work_h * 3600 / slots)
    return Bound(trace.name, cost, (last - first) / 60)
