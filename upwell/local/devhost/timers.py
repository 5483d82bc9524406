"""Timer triggers on NCRONTAB schedules, in UTC, never overlapping themselves.

The schedule may be ``%SETTING%`` (resolved from app settings, as the host
does). ``runOnStartup`` fires once when the host starts. An occurrence that
comes while the previous run of the same timer is still going is skipped and
logged, so one timer never runs twice at once. ``useMonitor`` is ignored: the
devhost keeps no schedule status in storage, so occurrences missed while it
was down are not made up. A TimeSpan schedule (``hh:mm:ss``) is refused: the
Flex Consumption plan upwell deploys to does not take it either.
"""

from __future__ import annotations

import datetime as dt
import re
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from azure.functions.timer import TimerRequest

from upwell import logs
from upwell.errors import ConfigError
from upwell.local.devhost.app import FunctionSpec
from upwell.local.devhost.invoke import Invoker
from upwell.ncrontab import Crontab, CrontabError, parse

log = logs.get("upwell.local.devhost")
_TIMESPAN = re.compile(r"^\d+(\.\d+)?(:\d+){1,2}(\.\d+)?$")
PAST_DUE_S = 1.0  # later than this after its occurrence, a run is reported as past due


def parse_schedule(text: str, where: str) -> Crontab:
    if _TIMESPAN.match(text.strip()):
        raise ConfigError(f"{where}: schedule {text!r} is a TimeSpan; use NCRONTAB such as '0 */5 * * * *' "
                          "(Flex Consumption takes only NCRONTAB)")
    try:
        return parse(text)
    except CrontabError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class TimerListener:
    """Fires one timer function. State: the schedule, the last occurrence, and the running future."""

    def __init__(self, spec: FunctionSpec, schedule: str, *, invoker: Invoker, stopping: threading.Event,
                 clock: Callable[[], dt.datetime] = _utcnow) -> None:
        self.spec, self.invoker, self.stopping, self.clock = spec, invoker, stopping, clock
        self.schedule = parse_schedule(schedule, f"function {spec.name}")
        self.run_on_startup = bool(spec.trigger.get("runOnStartup", False))
        self.last: dt.datetime | None = None
        self.skipped = 0
        self._running: Future | None = None
        self._lock = threading.Lock()

    def fire(self, submit: Callable[..., Future], scheduled: dt.datetime | None = None) -> Future | None:
        """Start a run unless the previous one is still going (then log, count, and return None)."""
        with self._lock:
            if self._running is not None and not self._running.done():
                self.skipped += 1
                log.warning("devhost.timer_skipped", function=self.spec.name, scheduled=str(scheduled),
                            reason="the previous run is still going")
                return None
            now = self.clock()
            past_due = scheduled is not None and (now - scheduled).total_seconds() > PAST_DUE_S
            request = TimerRequest(past_due=past_due, schedule={"AdjustForDST": True}, schedule_status={
                "Last": self.last.isoformat() if self.last else None,
                "Next": self.schedule.next_after(now).isoformat(), "LastUpdated": now.isoformat()})
            self.last = scheduled or now
            self._running = submit(self._invoke, request)
            return self._running

    def _invoke(self, request: TimerRequest) -> Any:
        return self.invoker.invoke(self.spec, request, {})

    def run(self, submit: Callable[..., Future]) -> None:
        """Wait for each occurrence and fire it, until the host stops."""
        if self.run_on_startup:
            self.fire(submit)
        due = self.schedule.next_after(self.clock())
        while not self.stopping.is_set():
            wait = (due - self.clock()).total_seconds()
            if wait > 0:
                self.stopping.wait(min(wait, 60.0))  # re-read the clock at least each minute
                continue
            self.fire(submit, due)
            due = self.schedule.next_after(max(due, self.clock()))
