"""Blob trigger on results/{name}: mark the shard done; the last one enqueues the report."""

from __future__ import annotations

import azure.functions as func
import azurefunctions.extensions.bindings.blob as blob_sdk

from handlers import context
from upwell import names
from upwell.results.collect import collect as collect_result

bp = func.Blueprint()


@bp.function_name("collect")
@bp.blob_trigger(arg_name="client", path=f"{names.RESULTS}/{{name}}", connection=names.CONNECTION,
                 source=func.BlobSource.EVENT_GRID)
def collect(client: blob_sdk.BlobClient) -> None:
    name = client.blob_name
    context.settle("collect", lambda: collect_result(context.storage(), name))
