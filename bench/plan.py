"""What ``run_all.py`` runs: each plan is a list of benches, each with its arguments and how many runs it gets.

Two plans:

- ``default`` (``make bench``, about 17 minutes on a shared 2-vCPU machine at load 3–11): every bench. The timed benches
  whose rows are ratios against a baseline run ``--repeat`` times, so each row shows its spread over runs.
  The scale, drop and reconcile benches run once, at sizes that still show how each cost grows (two sizes a
  measure: sweeps of 1,000 and 5,000 points, drops of 30 and 300 MB): their rows are counts, or growth ratios
  of one run, and their timings carry the spread of their own repeats within that run.
- ``scale`` (``make bench-scale``, 16 min 17 s whole on this machine): the same scale, drop and reconcile
  measures at the sizes issue 24 names (a 1,000- and a 100,000-point sweep, reports of 1,000 and 10,000
  shards, a 100 MB and a 1 GB drop, 10,000 uploads for the reconciler), once each.

A step's ``runs`` of ``None`` takes ``--repeat``; a number fixes it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    """One bench in a plan: ``bench/bench_<bench>.py`` with ``args``, ``runs`` times (None: ``--repeat``)."""

    bench: str
    args: tuple[str, ...] = ()
    runs: int | None = None


# The scale table at smaller sizes: 1,000 against 5,000 points, the reports built on those two sweeps' own jobs
# (a report size other than its sweep's ingests a sweep of that size first: half a minute more at 5,000), the
# end-to-end request count at 50 and 100 shards.
SCALE_DEFAULT = ("--small", "1000", "--big", "5000", "--report-small", "1000", "--report-big", "5000",
                 "--requests", "50,100", "--idle-small", "10", "--idle-big", "100")
SCALE_FULL = ("--small", "1000", "--big", "100000", "--report-small", "1000", "--report-big", "10000",
              "--requests", "100,400", "--idle-small", "10", "--idle-big", "200")

PLANS: dict[str, tuple[Step, ...]] = {
    "default": (
        Step("heat"), Step("train"), Step("pipeline"), Step("latency"), Step("scaling"),
        Step("reconcile", ("--blobs", "2000", "--new", "100", "--repeat", "3"), runs=1),
        Step("drop", ("--sizes", "100,300", "--repeat", "3"), runs=1),
        Step("scale", SCALE_DEFAULT, runs=1),
    ),
    "scale": (
        Step("reconcile", ("--blobs", "10000", "--new", "100", "--repeat", "3"), runs=1),
        Step("drop", ("--sizes", "100,1000", "--repeat", "2"), runs=1),
        Step("scale", SCALE_FULL, runs=1),
    ),
}


def steps(plan: str, only: set[str] | None = None) -> list[Step]:
    """The steps of ``plan``, in order, those named in ``only`` alone when it is given; a clear error for an
    unknown plan or bench name."""
    if plan not in PLANS:
        raise ValueError(f"unknown plan {plan!r}: one of {', '.join(PLANS)}")
    chosen = list(PLANS[plan])
    unknown = (only or set()) - {s.bench for s in chosen}
    if unknown:
        raise ValueError(f"plan {plan!r} has no bench {', '.join(sorted(unknown))}: it runs "
                         f"{', '.join(s.bench for s in chosen)}")
    return [s for s in chosen if not only or s.bench in only]


def runs(step: Step, repeat: int) -> int:
    """How many times ``step`` runs when the plan is run with ``--repeat repeat``."""
    return step.runs if step.runs is not None else max(1, repeat)
