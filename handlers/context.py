"""Settings and storage, read once per process at the edge of the Function App."""

from __future__ import annotations

import functools

from upwell import logs
from upwell.settings import Settings
from upwell.storage import Storage


@functools.cache
def settings() -> Settings:
    logs.configure()  # JSON, unless UPWELL_LOG_FORMAT=console (upwell up on a terminal)
    return Settings.from_env()


@functools.cache
def storage() -> Storage:
    store = Storage(settings().connection if settings().connection != "identity" else "identity")
    try:
        store.ensure()  # idempotent; on Azure the templates already created everything
    except Exception as exc:  # noqa: BLE001 - a missing right to create is not fatal: the names exist there
        logs.get("handlers").warning("storage.ensure_failed", error=str(exc).splitlines()[0][:200])
    return store


def reset() -> None:
    """Forget the cached settings and clients (tests change the environment)."""
    settings.cache_clear()
    storage.cache_clear()

