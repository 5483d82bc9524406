"""Where the storage a command talks to is, and whether it answers, asked before any SDK call.

The Storage SDK retries a refused connection with exponential back-off (azure-storage-blob's
``_shared/policies.py``, ``ExponentialRetry``: ``initial_backoff`` 15 s, ``increment_base`` 3, ``retry_total`` 3,
3 of them for connection errors; the queue and table clients alike), so a command against a stack that is down
waited over a minute and ended in a traceback. ``find`` picks the connection:

1. ``AzureWebJobsStorage`` (or its identity-based ``__serviceUri`` settings) when set;
2. else the running stack's state file, ``<home>/stack.json`` (``upwell.local.stack.load_state``; home is
   ``UPWELL_HOME``, else ``.upwell`` in the current folder), so ``upwell up --blob-port ...`` is followed;
3. else the one live ``upwell up`` of this machine's run dir (``upwell.local.owner``), for a command run from
   another folder;
4. else the emulator's standard ports, as ``UseDevelopmentStorage=true`` means (Azurite's documented
   development connection string: blob 10000, queue 10001, table 10002).

``check`` connects (TCP) to each endpoint on this machine's loopback. A closed port raises ``StackUnreachable``
with one line naming the service, the address, where the address came from and ``upwell up``. A stack whose
state file says ``starting`` is waited for, at most ``UPWELL_CLI_START_WAIT_S`` seconds, each try shown.
Endpoints elsewhere (a storage account on Azure) are not probed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from upwell import names
from upwell.errors import StackUnreachable
from upwell.local import azurite, owner
from upwell.local.stack import StackState, load_state

LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
SERVICES = ("blob", "queue", "table")
TRY_EVERY_S = 0.5


@dataclass(frozen=True)
class Target:
    """The connection a command will use, where it came from, and the stack state behind it (if any)."""

    connection: str
    source: str  # "AzureWebJobsStorage", the state file's path, "the run dir", or "the standard ports"
    state: StackState | None = None


def home() -> Path:
    """The local stack's state folder: UPWELL_HOME, else .upwell in the current folder."""
    return Path(os.environ.get("UPWELL_HOME") or ".upwell")


def find(env: dict[str, str] | None = None) -> Target:
    """The connection a command uses, in the order of the module's docstring."""
    env = dict(os.environ if env is None else env)
    if env.get(names.CONNECTION):
        return Target(env[names.CONNECTION], names.CONNECTION)
    if any(k.startswith(f"{names.CONNECTION}__") for k in env):
        return Target("identity", f"{names.CONNECTION}__*")
    where = Path(env.get("UPWELL_HOME") or ".upwell")
    state = load_state(where)
    if state is not None:
        return Target(state.connection_string, str(where / "stack.json"), state)
    live = owner.live_stacks()
    if len(live) == 1 and len(live[0].get("ports") or []) == 3:
        return Target(azurite.connection_string(*live[0]["ports"]), "the run dir's record of `upwell up`")
    return Target("UseDevelopmentStorage=true", "the standard ports")


def endpoints(connection: str) -> list[tuple[str, str, int]]:
    """(service, host, port) of each endpoint of ``connection`` on this machine's loopback."""
    parts = dict(p.split("=", 1) for p in connection.split(";") if "=" in p)
    if parts.get("UseDevelopmentStorage", "").lower() == "true":
        return [(s, azurite.HOST, p) for s, p in zip(SERVICES, azurite.DEFAULT_PORTS, strict=True)]
    found = []
    for service in SERVICES:
        url = urlsplit(parts.get(f"{service.capitalize()}Endpoint", ""))
        if url.hostname in LOOPBACK:
            found.append((service, url.hostname, url.port or (443 if url.scheme == "https" else 80)))
    return found


def check(target: Target, *, wait_s: float, say: Callable[[str], None], needs_host: bool = False) -> None:
    """Return once every loopback endpoint answers (and, with ``needs_host``, a starting stack is ready);
    raise StackUnreachable otherwise. Only a stack whose state file says ``starting`` is waited for."""
    tries = max(1, int(wait_s / TRY_EVERY_S))
    for attempt in range(1, tries + 1):
        closed = [e for e in endpoints(target.connection) if not azurite.port_open(e[2], e[1])]
        state = load_state(Path(target.source).parent) if target.state else None
        starting = state is not None and state.phase == "starting"
        if not closed and not (needs_host and starting):
            return
        if not starting or attempt == tries:
            break
        what = f"Azurite {closed[0][0]} on {closed[0][1]}:{closed[0][2]}" if closed else "the functions host"
        say(f"waiting for the stack that is starting (upwell up, pid {state.pid}): {what} not ready yet "
            f"({attempt}/{tries})")
        time.sleep(TRY_EVERY_S)
    raise StackUnreachable(_down(target, closed, starting, wait_s))


def _down(target: Target, closed: list[tuple[str, str, int]], starting: bool, wait_s: float) -> str:
    if not closed:
        return (f"the local stack is still starting after {wait_s:g} s (UPWELL_CLI_START_WAIT_S); see the "
                "terminal of `upwell up`")
    service, host, port = closed[0]
    if starting:
        return (f"Azurite ({service}) on {host}:{port} did not answer while the stack was starting; see the "
                "terminal of `upwell up`")
    hint = " (or fix AzureWebJobsStorage)" if target.source == names.CONNECTION else ""
    return (f"no stack running: Azurite ({service} storage) does not answer on {host}:{port} (from "
            f"{target.source}); start it with `upwell up`{hint}")
