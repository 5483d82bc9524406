"""Timer (hourly): the janitor finds leaked, idle, expired and overdue resources and acts as its policy says."""

from __future__ import annotations

import os

import azure.functions as func

from handlers import context
from upwell import logs
from upwell.ops import janitor as J

bp = func.Blueprint()
log = logs.get("handlers.janitor")


@bp.function_name("janitor")
@bp.timer_trigger(arg_name="timer", schedule="0 7 * * * *", run_on_startup=False, use_monitor=False)
def janitor(timer: func.TimerRequest) -> None:
    # UPWELL_JANITOR_APPLY=1 lets the timer act; otherwise it only records what it finds.
    apply = os.environ.get("UPWELL_JANITOR_APPLY", "").lower() in ("1", "true", "yes")
    try:
        findings = J.run(context.storage(), apply=apply, policy=J.Policy.load(os.environ.get("UPWELL_JANITOR_POLICY")))
        log.info("janitor.done", findings=len(findings), applied=apply)
    except Exception as exc:  # noqa: BLE001 - a periodic loop logs and goes on
        log.warning("janitor.failed", error=str(exc)[:300])
