"""How many local workers `upwell up` runs, and the table it prints at start.

``--workers 4`` sets every local pool's maximum; ``--workers cpu=4,mpi=1`` sets named ones. Each payload
process runs OMP_NUM_THREADS threads; unless it is set, `up` gives each worker an equal share of the
cores (the launcher's own default is every core, which N busy workers would oversubscribe N times).
"""

from __future__ import annotations

import dataclasses
import json
import os

from upwell.errors import ConfigError
from upwell.pools.base import PoolSpec


def with_workers(pools: dict[str, PoolSpec], text: str | None) -> dict[str, PoolSpec]:
    """Apply ``--workers`` to the local pools; an error names the pool or the value that is wrong."""
    if not text:
        return dict(pools)
    local = [n for n, p in pools.items() if p.backend == "local"]
    wanted: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.rpartition("=")
        for pool in ([name] if name else local):
            if pool not in pools:
                raise ConfigError(f"--workers: no pool {pool!r}; pools: {', '.join(pools)}")
            try:
                wanted[pool] = int(value)
            except ValueError:
                raise ConfigError(f"--workers: {value!r} is not a whole number") from None
            if wanted[pool] < 0:
                raise ConfigError(f"--workers: {pool} needs 0 or more workers, not {wanted[pool]}")
    return {n: dataclasses.replace(p, max_nodes=wanted[n], min_nodes=min(p.min_nodes, wanted[n]))
            if n in wanted else p for n, p in pools.items()}


def threads_per_worker(pools: dict[str, PoolSpec], env: dict[str, str], cores: int) -> tuple[int, bool]:
    """(OMP threads per payload, whether the user set it)."""
    if env.get("OMP_NUM_THREADS", "").isdigit():
        return max(1, int(env["OMP_NUM_THREADS"])), True
    most = max([p.max_nodes for p in pools.values() if p.backend == "local"] or [1])
    return max(1, cores // max(1, most)), False


def oversubscribed(pools: dict[str, PoolSpec], threads: int, cores: int) -> list[str]:
    """A warning for each local pool whose busy workers would run more threads than there are cores."""
    return [f"pool {n}: up to {p.max_nodes} workers x {threads} threads = {p.max_nodes * threads} threads on "
            f"{cores} cores; lower --workers or OMP_NUM_THREADS" for n, p in pools.items()
            if p.backend == "local" and p.max_nodes * threads > cores]


def to_setting(pools: dict[str, PoolSpec]) -> str:
    """UPWELL_POOLS for the children: every pool, every field, so nothing falls back to another default."""
    return json.dumps({n: {k: v for k, v in dataclasses.asdict(p).items() if k != "name"} for n, p in pools.items()})


def table_rows(pools: dict[str, PoolSpec], threads: int) -> list[tuple[str, ...]]:
    rows = []
    for name, p in pools.items():
        try:
            from upwell import cost

            price = f"{cost.price(p.price_key, False):.3f}"
        except Exception:  # noqa: BLE001 - an unknown key prices at nothing; the table says so
            price = "?"
        rows.append((name, p.backend, f"{p.min_nodes}-{p.max_nodes}", str(threads) if p.backend == "local" else "-",
                     p.price_key, price, f"{p.cooldown_s:g}", str(p.scale_down_votes)))
    return rows


HEADERS = ("pool", "backend", "workers", "threads each", "priced as", "$/h", "cooldown s", "scale-down votes")


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
