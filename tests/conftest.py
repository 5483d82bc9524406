"""Shared fixtures: a real Azurite for the session, and the storage connection in the environment.

Tests live in one folder per kind, and the folder sets the kind's marker (``pytest -m contract``):
``unit`` (pure logic, no service), ``integration`` (Azurite, real processes), ``contract`` (the real
Azure SDK clients against a recording local server), ``faults`` (kills, restarts, duplicates; nothing
lost) and ``e2e`` (the whole stack to a report). A test module never sets its kind by hand.

The ``azurite`` fixture starts Azurite from ``node_modules`` on free ports in a
temporary folder. When it cannot start, the tests that need it FAIL with the
reason (DESIGN.md: a fixture that cannot start Azurite fails, it does not skip).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pipeline_helpers import azurite_in
from upwell.local.azurite import Azurite
from upwell.local.stack import SHARED_MACHINE_WAITS
from upwell.names import CONNECTION

REPO = Path(__file__).resolve().parent.parent

# The agents these tests start in their own process run MPI and OpenMP payloads on the cores that the other test
# worker (pytest -n 2) and Azurite use as well, as `upwell up`'s local nodes do: their ranks and threads give the
# core back while they wait, as upwell.local.stack sets for its nodes (SHARED_MACHINE_WAITS says why).
for _name, _value in SHARED_MACHINE_WAITS.items():
    os.environ.setdefault(_name, _value)


KINDS = ("unit", "integration", "contract", "faults", "e2e")


# The order the kinds run in: the longest first. `make test` hands whole files to two workers in collection
# order (--dist loadfile --no-loadscope-reorder); ending on the many short unit files leaves neither worker idle
# while the other finishes a minute-long end-to-end file (xdist's own order, most tests first, put those last).
RUN_ORDER = ("e2e", "faults", "integration", "contract", "unit")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with the kind of the folder it sits in (a test outside them is an error), and order the
    kinds by RUN_ORDER, keeping each kind's own order."""
    kinds = {}
    for item in items:
        rel = Path(str(item.path)).resolve().relative_to(REPO / "tests")
        kind = rel.parts[0] if len(rel.parts) > 1 else ""
        if kind not in KINDS:
            raise pytest.UsageError(f"{rel}: a test module belongs in one of tests/{{{','.join(KINDS)}}}/")
        item.add_marker(getattr(pytest.mark, kind))
        kinds[item.nodeid] = RUN_ORDER.index(kind)
    items.sort(key=lambda item: kinds[item.nodeid])


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """A running Azurite (blob, queue, table) with its data in a session temp folder; has ``.connection_string``."""
    yield from azurite_in(tmp_path_factory.mktemp("azurite"))


@pytest.fixture
def storage_env(azurite: Azurite, monkeypatch: pytest.MonkeyPatch) -> str:
    """Set AzureWebJobsStorage to the session Azurite's connection string; returns it."""
    monkeypatch.setenv(CONNECTION, azurite.connection_string)
    return azurite.connection_string
