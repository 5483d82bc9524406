"""Timer: scale every pool to its backlog, and re-enqueue reports that were lost."""

from __future__ import annotations

import functools

import azure.functions as func

from handlers import context
from upwell import logs
from upwell.errors import UpwellError
from upwell.ingest.ingestor import recheck_waiting
from upwell.results.publish import reconcile
from upwell.scale.autoscaler import Autoscaler

bp = func.Blueprint()
log = logs.get("handlers.scale")


@functools.cache
def autoscaler() -> Autoscaler:
    return Autoscaler(context.storage(), context.settings())


def nudge() -> None:
    """Scale now, not at the next tick: ingest has just enqueued work. Skipped while a run is on (the
    Autoscaler's lock); a failure is logged, never raised into the ingest that called it."""
    try:
        autoscaler().adapt()
    except Exception as exc:  # noqa: BLE001 - the timer scales at its next tick anyway
        log.warning("scale.nudge_failed", error=str(exc)[:300])


@bp.function_name("scale")
@bp.timer_trigger(arg_name="timer", schedule="%UPWELL_SCALE_SCHEDULE%", run_on_startup=False, use_monitor=False)
def scale(timer: func.TimerRequest) -> None:
    autoscaler().adapt()
    try:
        reconcile(context.storage())
    except UpwellError as exc:  # a periodic loop logs and goes on
        log.warning("handlers.reconcile_failed", error=str(exc)[:300], code=exc.code)
    try:
        recheck_waiting(context.storage(), context.settings())
    except UpwellError as exc:
        log.warning("handlers.recheck_waiting_failed", error=str(exc)[:300], code=exc.code)
