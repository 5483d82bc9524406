"""Ratios that a changing machine load does not skew: a subject and its baseline measured in interleaved pairs.

A ratio of two timings taken a minute apart on a shared machine measures the load as much as the code (the
training row read 0.97 in one run and 0.84 in the next). Here the baseline and the subject run in turn, in
pairs, in one process; pair k runs the baseline first when k is even and the subject first when k is odd
(A B, B A, A B, ...), so a load that rises or falls through the run hits both sides alike. Each pair gives
one ratio, and the figure is the median of the per-pair ratios: one pair caught by a burst of load moves
the median little. Each sample should be seconds of work (``repeats_for``), so that scheduler ticks and
timer resolution are a small part of it.

Across runs, ``spread`` is (max − min) ÷ median of the repeated figures: two runs on a quiet machine should
agree within ``STABLE`` (5%); ``run_all.py`` flags a row over it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")
U = TypeVar("U")

STABLE = 0.05  # two runs of a bench on a quiet machine agree within this, as (max − min) ÷ median


def interleave(baseline: Callable[[], T], subject: Callable[[], U], pairs: int) -> tuple[list[T], list[U]]:
    """Run ``baseline`` and ``subject`` ``pairs`` times each, alternating their order pair by pair (A B, B A,
    ...); return their samples, the baseline's first, index k of each list from pair k."""
    if pairs < 1:
        raise ValueError(f"pairs must be at least 1, got {pairs}")
    base: list[T] = []
    subj: list[U] = []
    for k in range(pairs):
        if k % 2 == 0:
            base.append(baseline())
            subj.append(subject())
        else:
            subj.append(subject())
            base.append(baseline())
    return base, subj


def pair_ratios(subject: Sequence[float], baseline: Sequence[float]) -> list[float]:
    """subject[k] ÷ baseline[k] for each pair k (rates, or any figures of the same kind and direction)."""
    if len(subject) != len(baseline) or not subject:
        raise ValueError(f"need the same number of samples on both sides, at least one: {len(subject)} and "
                         f"{len(baseline)}")
    if any(b <= 0 for b in baseline):
        raise ValueError(f"a baseline sample is not positive: {list(baseline)}")
    return [s / b for s, b in zip(subject, baseline, strict=True)]


def median_ratio(subject: Sequence[float], baseline: Sequence[float]) -> float:
    """The median of the per-pair ratios: the figure a bench reports."""
    return statistics.median(pair_ratios(subject, baseline))


def high_ratio(subject: Sequence[float], baseline: Sequence[float], q: float = 0.9) -> float:
    """The ratio of each side's ``q`` quantile (nearest rank) of rates, higher being better: what each reaches
    when nothing else holds the resource. For a rate that something outside the run moves on both sides
    unequally (the memory bandwidth of a VM whose host is shared: a copy feels all of it, a kernel part),
    the per-pair ratios move with it, while each side's high samples hold still (``bench_heat.py``)."""
    return quantile(subject, q) / quantile(baseline, q)


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` by nearest rank (one of the values)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def spread(values: Sequence[float]) -> float | None:
    """(max − min) ÷ median of repeated figures; None with fewer than two, or a median of 0."""
    if len(values) < 2:
        return None
    median = statistics.median(values)
    return (max(values) - min(values)) / abs(median) if median else None


def repeats_for(one_s: float, target_s: float, cap: int = 100_000) -> int:
    """How many repetitions of a step that took ``one_s`` seconds make a sample of at least ``target_s``
    (at least 1, at most ``cap``)."""
    if one_s <= 0:
        return cap
    return max(1, min(cap, math.ceil(target_s / one_s)))


def calibrate(step: Callable[[], object], target_s: float, clock: Callable[[], float] = time.perf_counter) -> int:
    """Repetitions of ``step`` that make a sample of at least ``target_s`` on ``clock``: timed over doubling
    runs until one takes a tenth of the target, so one step caught by a busy moment does not size the sample."""
    reps = 1
    while True:
        started = clock()
        for _ in range(reps):
            step()
        took = clock() - started
        if took >= target_s / 10 or reps >= 1 << 20:
            return max(reps, repeats_for(took / reps, target_s))
        reps *= 2
