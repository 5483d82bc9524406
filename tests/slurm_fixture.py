"""The running local Slurm cluster that the Slurm tests share: started, handed over, always stopped."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from upwell.local.slurm_cluster import LocalSlurm, SlurmUnavailable


@contextmanager
def running_slurm(root: Path, **options) -> Iterator[LocalSlurm]:
    """A LocalSlurm (``options``: nodes, cpus, hosts) under ``root``; a cluster that cannot start fails the
    test with the reason (never a skip), and whatever happens it is stopped afterwards."""
    try:
        cluster = LocalSlurm(root, **options).start()
    except SlurmUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()
