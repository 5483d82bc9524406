"""Event Grid trigger on results/: mark the shard done; the last one enqueues the report.

Event Grid delivers each result's BlobCreated event straight to this function (the Event Grid extension's
webhook; bicep/main.bicep's blobTriggers entry with `webhook: 'eventgrid'`), so no host queue, message or blob
read stands between a result and its collect: the function reads the result itself. The subscription delivers
only subjects under results/ ending in `.json`; any other blob that still arrives (a `.json` artifact under
results/<job>/<shard>/) is dropped here by its name alone, before storage is opened. A failure answers 500 and
Event Grid retries on its schedule, then dead-letters; the reconciler collects what neither delivered.
"""

from __future__ import annotations

import azure.functions as func

from handlers import context
from upwell import logs, names
from upwell.ops.eventblobs import subject_blob
from upwell.results.collect import collect as collect_result
from upwell.results.collect import is_shard_result

bp = func.Blueprint()
log = logs.get("handlers.collect")


@bp.function_name("collect")
@bp.event_grid_trigger(arg_name="event")
def collect(event: func.EventGridEvent) -> None:
    container, name = subject_blob(event.subject) or ("", "")
    if container != names.RESULTS or not is_shard_result(name):
        log.debug("collect.not_a_result", subject=event.subject[:300], event_type=event.event_type)
        return
    context.settle("collect", lambda: collect_result(context.storage(), name, views=context.job_views()))
