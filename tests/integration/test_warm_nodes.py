"""Issue 25 item 15: a pool keeps ``min_nodes`` agents warm between interactive jobs. The first ``min_nodes``
local agents never exit on idle; the others exit after the idle timeout; scale-in drains the others first."""

from __future__ import annotations

import os

from tests.pipeline_helpers import wait_for
from upwell import names
from upwell.pools import process
from upwell.pools.base import PoolSpec
from upwell.pools.process import LocalPool


def _argv(pid: int) -> list[str]:
    """The argv the pool started the agent with (a cold agent may already have exited on idle under a loaded
    machine: a zombie's /proc cmdline is empty, so the launch itself is asked)."""
    return [str(a) for a in process._CHILDREN[pid].args]


def test_min_nodes_stay_warm_past_the_idle_timeout_and_the_others_go(store, azurite, tmp_path):
    env = {**os.environ, names.CONNECTION: azurite.connection_string, "UPWELL_POLL_S": "0.2"}
    pool = LocalPool(PoolSpec("cpu", backend="local", min_nodes=1, max_nodes=3), tmp_path, idle_exit_s=3.0, env=env)
    try:
        pool.scale_to(3)
        started = pool._workers()
        warm = [w for w in started if (pool.dir / f"{w}.warm").exists()]
        assert len(started) == 3 and len(warm) == 1, started
        idle_exits = {w: _argv(pid)[_argv(pid).index("--idle-exit") + 1] for w, (pid, _) in started.items()}
        assert sorted(idle_exits.values()) == ["0.0", "3.0", "3.0"] and idle_exits[warm[0]] == "0.0", idle_exits
        # The cold agents go after three seconds without work; the warm one is still there after they have gone.
        wait_for(lambda: list(pool._workers()) == warm, 90, "the two cold agents to exit on idle",
                 lambda: str(pool._workers()))
        assert pool.status().target == 1
        # Scaled up again and then in: the new cold agent is drained, the warm one stays.
        pool.scale_to(2)
        wait_for(lambda: all(s == "idle" for _, s in pool._workers().values()), 60, "both agents idle")
        pool.scale_to(1)
        wait_for(lambda: list(pool._workers()) == warm, 60, "the cold agent to be drained")
    finally:
        pool.close(timeout=15)
