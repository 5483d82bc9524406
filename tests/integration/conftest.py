"""Fixtures shared by the integration tests: the session Azurite as a ready ``Storage``, and real local pools."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from upwell import names
from upwell.pools.base import PoolSpec
from upwell.pools.process import LocalPool
from upwell.storage import Storage


@pytest.fixture
def store(storage_env) -> Storage:
    """The session Azurite with every container, queue and table in place, and no work left in the cpu queue
    by an earlier test."""
    s = Storage(storage_env)
    s.ensure()
    s.queue(names.work_queue("cpu")).clear_messages()
    return s


@pytest.fixture()
def local(azurite, tmp_path):
    """Makes real local pools: agents are processes of ``python -m workers.agent`` on this test's Azurite,
    each pool's state under its own folder unless given one; every pool made is closed afterwards."""
    made: list[LocalPool] = []
    env = {**os.environ, names.CONNECTION: azurite.connection_string, "UPWELL_POLL_S": "0.5"}

    def make(spec: PoolSpec, state_dir: Path | None = None) -> LocalPool:
        made.append(LocalPool(spec, state_dir or tmp_path / "pools", idle_exit_s=120, env=env))
        return made[-1]

    yield make
    for pool in made:
        pool.close(timeout=15)
