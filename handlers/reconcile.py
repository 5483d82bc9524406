"""Timer: re-drive missed, dead-lettered and poisoned events (upwell.ops.reconcile)."""

from __future__ import annotations

import azure.functions as func

from handlers import context
from upwell.ops.reconcile import Reconciler

bp = func.Blueprint()


@bp.function_name("reconcile")
@bp.timer_trigger(arg_name="timer", schedule="%UPWELL_RECONCILE_SCHEDULE%", run_on_startup=False, use_monitor=False)
def reconcile(timer: func.TimerRequest) -> None:
    Reconciler(context.storage(), context.settings()).run()
