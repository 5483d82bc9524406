"""The logistic map x <- r x (1 - x): a cheap, chaotic parameter sweep, with fault injection.

Metrics: r, lyapunov (mean log|r (1 - 2x)| after burn-in), mean, std, period
(the number of distinct attractor points when at most 64, else 0), attractor
(up to 256 of the last iterates, for a bifurcation plot), steps, burn_in.
``sleep_s`` adds simulated compute time (a SIGTERM during it exits 75);
``fail_first_attempts`` makes attempts 1..N exit 1.
"""

from __future__ import annotations

import math
import sys
import time

from upwell.payloads.models import LogisticParams
from workers.payloads.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PREEMPTED,
    Context,
    install_stop_handler,
    mark_preempted,
    run_main,
    write_metrics,
)

ATTRACTOR_POINTS = 256
MAX_PERIOD = 64


def iterate(r: float, x0: float, steps: int, burn_in: int) -> tuple[list[float], float]:
    """The iterates after burn-in, and the Lyapunov exponent over them."""
    x = x0
    for _ in range(burn_in):
        x = r * x * (1.0 - x)
    xs, log_sum = [], 0.0
    for _ in range(steps):
        log_sum += math.log(max(abs(r * (1.0 - 2.0 * x)), 1e-300))
        x = r * x * (1.0 - x)
        xs.append(x)
    return xs, log_sum / steps


def period(xs: list[float], tol: float = 1e-6) -> int:
    """Distinct values among the last iterates (a periodic orbit), or 0 when there are too many."""
    tail = sorted(xs[-4 * MAX_PERIOD:])
    distinct = 1
    for a, b in zip(tail, tail[1:], strict=False):
        if b - a > tol:
            distinct += 1
            if distinct > MAX_PERIOD:
                return 0
    return distinct


def main(ctx: Context) -> int:
    stop = install_stop_handler()
    p = LogisticParams(**ctx.params)
    if ctx.attempt <= p.fail_first_attempts:
        print(f"injected failure: attempt {ctx.attempt} of the first {p.fail_first_attempts}",
              file=sys.stderr, flush=True)
        return EXIT_FAILED
    deadline = time.monotonic() + p.sleep_s
    while time.monotonic() < deadline:
        if stop:
            mark_preempted(ctx, None)  # nothing worth keeping: the map itself takes milliseconds
            return EXIT_PREEMPTED
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    xs, lyapunov = iterate(p.r, p.x0, p.steps, p.burn_in)
    mean = sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))
    write_metrics(ctx, {"r": p.r, "lyapunov": lyapunov, "mean": mean, "std": std, "period": period(xs),
                        "attractor": [round(x, 9) for x in xs[-ATTRACTOR_POINTS:]],
                        "steps": p.steps, "burn_in": p.burn_in, "attempt": ctx.attempt})
    return EXIT_OK


if __name__ == "__main__":
    run_main(main)
