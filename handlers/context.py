"""Settings and storage, read once per process at the edge of the Function App."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

from upwell import logs
from upwell.errors import UpwellError
from upwell.settings import Settings
from upwell.storage import Storage

T = TypeVar("T")
log = logs.get("handlers")


@functools.cache
def settings() -> Settings:
    logs.configure()  # JSON, unless UPWELL_LOG_FORMAT=console (upwell up on a terminal)
    return Settings.from_env()


@functools.cache
def storage() -> Storage:
    store = Storage(settings().connection)
    try:
        store.ensure()  # idempotent; on Azure the templates already created everything
    except UpwellError as exc:  # a missing right to create is not fatal: the names exist there
        log.warning("handlers.storage_ensure_failed", error=str(exc).splitlines()[0][:200], code=exc.code)
    return store


def settle(what: str, call: Callable[[], T]) -> T | None:
    """Run a handler's one call into upwell. A permanent upwell error is logged and dropped (retrying
    the same input cannot help; the reconciler re-drives what needs it); a transient one raises, so
    the host redelivers the trigger."""
    try:
        return call()
    except UpwellError as exc:
        if not exc.permanent:
            raise
        log.error(f"handlers.{what}_dropped", error=str(exc)[:500], code=exc.code, kind=type(exc).__name__)
        return None


def reset() -> None:
    """Forget the cached settings and clients (tests change the environment)."""
    settings.cache_clear()
    storage.cache_clear()

