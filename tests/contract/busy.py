"""Contract-test plumbing: bind the busy set a test stands for to a pool's calls."""

from __future__ import annotations

import functools
from collections.abc import Collection

from upwell.pools.base import WorkerPool


def with_busy(pool: WorkerPool, busy: Collection[str] | None) -> WorkerPool:
    """Every ``scale_to`` and ``status`` call of ``pool`` passes ``busy`` (the ledger's view, which
    the Autoscaler observes once per run and passes in)."""
    pool.scale_to = functools.partial(pool.scale_to, busy=busy)  # type: ignore[method-assign]
    pool.status = functools.partial(pool.status, busy=busy)  # type: ignore[method-assign]
    return pool
