"""Shared fixtures: a real Azurite for the session, and the storage connection in the environment.

The ``azurite`` fixture starts Azurite from ``node_modules`` on free ports in a
temporary folder. When it cannot start, the tests that need it FAIL with the
reason (DESIGN.md: a fixture that cannot start Azurite fails, it does not skip).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pipeline_helpers import azurite_in
from upwell.local.azurite import Azurite
from upwell.names import CONNECTION

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """A running Azurite (blob, queue, table) with its data in a session temp folder; has ``.connection_string``."""
    yield from azurite_in(tmp_path_factory.mktemp("azurite"))


@pytest.fixture
def storage_env(azurite: Azurite, monkeypatch: pytest.MonkeyPatch) -> str:
    """Set AzureWebJobsStorage to the session Azurite's connection string; returns it."""
    monkeypatch.setenv(CONNECTION, azurite.connection_string)
    return azurite.connection_string
