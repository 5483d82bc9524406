"""Queue trigger on `notify`: deliver one job event (upwell.after.notify); a failure is recorded on the
job, never raised, so no delivery is retried by the host past its own backoff."""

from __future__ import annotations

import json

import azure.functions as func

from handlers import context
from upwell import names
from upwell.after.notify import deliver

bp = func.Blueprint()


@bp.function_name("notify")
@bp.queue_trigger(arg_name="msg", queue_name=names.NOTIFY_QUEUE, connection=names.CONNECTION)
def notify(msg: func.QueueMessage) -> None:
    try:
        body = json.loads(msg.get_body().decode())
        job_id, event = str(body["job_id"]), str(body["event"])
    except (ValueError, KeyError, TypeError):
        return  # undecodable: nothing to deliver
    context.settle("notify", lambda: deliver(context.storage(), context.settings(), job_id, event))
