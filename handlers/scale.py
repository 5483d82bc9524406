"""Timer: scale every pool to its backlog, re-enqueue reports that were lost, and recheck waiting manifests.

An idle tick reads the open-jobs index once (the autoscaler's read, reused by the recheck), each pool's
queue length and the head of the ended-jobs index; the job rows of reports already seen are not read again
(``REPORTED``, a memo of index entries; see upwell.scale.autoscaler for the pools' part).
"""

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
REPORTED: set[str] = set()  # ended-index entries whose jobs this process found reported (publish.reconcile)


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
    scaler = autoscaler()
    scaler.open_rows = None
    scaler.adapt()
    try:
        reconcile(context.storage(), reported=REPORTED)
    except UpwellError as exc:  # a periodic loop logs and goes on
        log.warning("handlers.reconcile_failed", error=str(exc)[:300], code=exc.code)
    try:
        recheck_waiting(context.storage(), context.settings(), open_rows=scaler.open_rows)
    except UpwellError as exc:
        log.warning("handlers.recheck_waiting_failed", error=str(exc)[:300], code=exc.code)
