"""Keep leases alive while a function runs: one thread renews every registered lease.

A queue message is received with a visibility lease and a blob receipt is
leased while its function runs; both would lapse during a long invocation, so
each one registers a ``renew`` callable here and removes it when done. A renew
that fails is logged and retried at the next interval; the lease may then lapse,
which only means another host may run the same input again (at-least-once).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable

from upwell import logs

log = logs.get("upwell.local.devhost")


class Renewer:
    """State: key -> (renew callable, interval, next due time), and the renewing thread."""

    def __init__(self, tick: float = 0.5) -> None:
        self.tick = tick
        self._leases: dict[int, tuple[Callable[[], None], float, float]] = {}
        self._keys = itertools.count()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, renew: Callable[[], None], interval: float) -> int:
        with self._lock:
            key = next(self._keys)
            self._leases[key] = (renew, interval, time.monotonic() + interval)
        return key

    def remove(self, key: int) -> None:
        with self._lock:
            self._leases.pop(key, None)

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="devhost-renewer", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def renew_due(self) -> None:
        now = time.monotonic()
        with self._lock:
            due = [(k, r, i) for k, (r, i, at) in self._leases.items() if at <= now]
        for key, renew, interval in due:
            try:
                renew()
            except Exception as exc:  # noqa: BLE001 - one lease failing to renew never stops the others
                log.warning("devhost.lease_renew_failed", error=f"{type(exc).__name__}: {exc}")
            with self._lock:
                if key in self._leases:
                    self._leases[key] = (renew, interval, time.monotonic() + interval)

    def _run(self) -> None:
        while not self._stop.wait(self.tick):
            self.renew_due()
