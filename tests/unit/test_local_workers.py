"""`upwell up --workers`, the pool table and the oversubscription warning (pure)."""

from __future__ import annotations

import pytest

from upwell.errors import ConfigError
from upwell.local import workers
from upwell.settings import Settings, parse_pools


def _pools():
    return Settings.from_env({}).pools


def test_workers_for_every_local_pool_or_named_ones():
    assert {n: p.max_nodes for n, p in workers.with_workers(_pools(), "2").items()} == {"cpu": 2, "mpi": 2, "gpu": 2}
    named = workers.with_workers(_pools(), "cpu=4, mpi=1")
    assert (named["cpu"].max_nodes, named["mpi"].max_nodes, named["gpu"].max_nodes) == (4, 1, _pools()["gpu"].max_nodes)
    assert workers.with_workers(_pools(), None) == _pools()
    for bad, says in (("tpu=2", "no pool 'tpu'"), ("cpu=two", "'two' is not a whole number"), ("-1", "0 or more")):
        with pytest.raises(ConfigError, match=says):
            workers.with_workers(_pools(), bad)


def test_threads_share_the_cores_unless_set_and_oversubscription_is_named():
    pools = workers.with_workers(_pools(), "cpu=4,mpi=2,gpu=1")
    assert workers.threads_per_worker(pools, {}, 8) == (2, False)
    assert workers.oversubscribed(pools, 2, 8) == []
    assert workers.threads_per_worker(pools, {"OMP_NUM_THREADS": "4"}, 8) == (4, True)
    warned = workers.oversubscribed(pools, 4, 8)
    assert warned == ["pool cpu: up to 4 workers x 4 threads = 16 threads on 8 cores; lower --workers or "
                      "OMP_NUM_THREADS"]
    assert workers.oversubscribed(workers.with_workers(_pools(), "6"), 1, 2)[0].startswith("pool cpu: up to 6")


def test_the_setting_for_the_children_round_trips_and_the_table_has_every_pool():
    pools = workers.with_workers(_pools(), "cpu=3")
    assert parse_pools(workers.to_setting(pools), {}) == pools
    rows = workers.table_rows(pools, 1)
    assert [r[0] for r in rows] == ["cpu", "mpi", "gpu"]
    cpu = rows[0]
    assert cpu[2] == "0-3" and cpu[4] == pools["cpu"].price_key and float(cpu[5]) > 0 and cpu[6] == "10"
