"""Blob trigger on incoming/{name}: validate, shard, write the ledger, enqueue work."""

from __future__ import annotations

import azure.functions as func
import azurefunctions.extensions.bindings.blob as blob_sdk

from handlers import context
from handlers.scale import nudge
from upwell import names
from upwell.ingest.ingestor import Ingestor

bp = func.Blueprint()


@bp.function_name("ingest")
@bp.blob_trigger(arg_name="client", path=f"{names.INCOMING}/{{name}}", connection=names.CONNECTION,
                 source=func.BlobSource.EVENT_GRID)
def ingest(client: blob_sdk.BlobClient) -> None:
    # An SDK client, not an InputStream: nothing is downloaded before validation decides to read it.
    # Bad input is quarantined inside; transient storage errors raise, so the host retries.
    name = client.blob_name
    out = context.settle("ingest", lambda: Ingestor(context.storage(), context.settings()).ingest(name))
    if out is not None and out.status == "accepted" and context.settings().scale_on_ingest:
        nudge()  # dispatch need not wait for the scale timer's next tick
