"""Blob trigger on results/{name}: mark the shard done; the last one enqueues the report."""

from __future__ import annotations

import azure.functions as func

from handlers import context
from upwell import names
from upwell.results.collect import collect as collect_result

bp = func.Blueprint()


@bp.function_name("collect")
@bp.blob_trigger(arg_name="blob", path=f"{names.RESULTS}/{{name}}", connection=names.CONNECTION,
                 source=func.BlobSource.EVENT_GRID)
def collect(blob: func.InputStream) -> None:
    name = context.blob_name(blob.name, names.RESULTS)
    context.settle("collect", lambda: collect_result(context.storage(), name))
