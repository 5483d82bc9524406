"""Queue trigger on `report`: build the job's report, exactly once."""

from __future__ import annotations

import json

import azure.functions as func

from handlers import context
from upwell import names
from upwell.results.publish import publish

bp = func.Blueprint()


@bp.function_name("report")
@bp.queue_trigger(arg_name="msg", queue_name=names.REPORT_QUEUE, connection=names.CONNECTION)
def report(msg: func.QueueMessage) -> None:
    try:
        job_id = json.loads(msg.get_body().decode())["job_id"]
    except (ValueError, KeyError, TypeError):
        return  # undecodable: dropping it is safe, the scale timer's reconciler re-enqueues real reports
    context.settle("report", lambda: publish(context.storage(), job_id, settings=context.settings()))
