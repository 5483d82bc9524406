"""Blob trigger on results/{name}: mark the shard done; the last one enqueues the report.

The Event Grid subscription delivers only subjects ending in `.json` (bicep/main.bicep's blobTriggers);
any other blob that still arrives (a `.json` artifact under results/<job>/<shard>/) is dropped here
by its name alone, before storage is opened.
"""

from __future__ import annotations

import azure.functions as func
import azurefunctions.extensions.bindings.blob as blob_sdk

from handlers import context
from upwell import logs, names
from upwell.results.collect import collect as collect_result
from upwell.results.collect import is_shard_result

bp = func.Blueprint()
log = logs.get("handlers.collect")


@bp.function_name("collect")
@bp.blob_trigger(arg_name="client", path=f"{names.RESULTS}/{{name}}", connection=names.CONNECTION,
                 source=func.BlobSource.EVENT_GRID)
def collect(client: blob_sdk.BlobClient) -> None:
    name = client.blob_name
    if not is_shard_result(name):
        log.debug("collect.not_a_result", blob=name)
        return
    context.settle("collect", lambda: collect_result(context.storage(), name))
