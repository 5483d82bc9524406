"""Event Grid-sourced blob triggers: the host queue that the blobs webhook fills, run as the extension runs it.

The Storage extension (``SharedBlobQueueListenerFactory``, ``BlobQueueTriggerExecutor``)
listens on ``azure-webjobs-blobtrigger-<hostId>`` with queue options made from
host.json ``extensions.blobs``: ``maxDequeueCount`` = ``poisonBlobThreshold``
(default 5), no delay before a failed message is visible again, a batch of
``min(32, maxDegreeOfParallelism // 2 + 1)`` and the rest of the parallelism as
the new-batch threshold. For each ``BlobTriggerMessage``:

* a ``FunctionId`` this host does not have: the message is deleted;
* a blob that no longer exists: the message is deleted;
* otherwise the function runs on the blob as it is now (in Event Grid mode the
  ETag is not compared), with the blob's binding data;
* a failure makes the message visible again at once; the failure that reaches
  the threshold copies the message as is to ``webjobs-blobtrigger-poison``.

No receipts are written in this mode.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass

import structlog
from azure.core.exceptions import ResourceNotFoundError

from upwell.local.devhost.app import FunctionSpec
from upwell.local.devhost.blobs import BlobPath, blob_properties
from upwell.local.devhost.clients import HostStorage, MessageCodec
from upwell.local.devhost.config import QueueSettings
from upwell.local.devhost.invoke import Invoker, blob_trigger_argument
from upwell.local.devhost.queues import Lease, QueueListener
from upwell.local.devhost.renewer import Renewer
from upwell.names import BLOB_POISON_QUEUE

log = structlog.get_logger("upwell.local.devhost")


def queue_settings(parallelism: int, poison_threshold: int, max_polling_interval: float,
                   encoding: str) -> QueueSettings:
    """The extension's BlobsOptions -> QueuesOptions mapping."""
    batch = max(1, min(32, parallelism // 2 + 1))
    return QueueSettings(batch_size=batch, new_batch_threshold=max(0, parallelism - batch), visibility_timeout=0.0,
                         max_polling_interval=max_polling_interval, max_dequeue_count=poison_threshold,
                         message_encoding=encoding)


@dataclass(frozen=True)
class Registration:
    spec: FunctionSpec
    path: BlobPath
    source: HostStorage


class BlobQueueListener(QueueListener):
    """Runs the blob-trigger messages of every Event Grid-sourced function of this host."""

    def __init__(self, registrations: dict[str, Registration], queue: str, *, storage: HostStorage, invoker: Invoker,
                 settings: QueueSettings, codec: MessageCodec, renewer: Renewer,
                 stopping: threading.Event) -> None:
        super().__init__(None, queue, storage=storage, invoker=invoker, settings=settings, codec=codec,
                         renewer=renewer, stopping=stopping)
        self.registrations = registrations
        self.poison_target = BLOB_POISON_QUEUE

    def _settle(self, leased: Lease) -> None:
        message, limit = leased.message, self.settings.max_dequeue_count
        if self.stopping.is_set():
            return leased.release(0)
        if message.dequeue_count > limit:  # its last runs ended with the host
            return self._poison(leased)
        try:
            body = json.loads(self.codec.decode(message.content or ""))
            registration = self.registrations.get(body["FunctionId"])
            container, name = body["ContainerName"], body["BlobName"]
        except (ValueError, KeyError, TypeError):
            log.error("devhost.blob_message_unreadable", queue=self.queue, message_id=message.id)
            return self._poison(leased)
        if registration is None or container != registration.path.container:
            log.info("devhost.blob_message_no_function", function_id=body.get("FunctionId"))
            return leased.delete()
        if self._run(registration, name):
            return leased.delete()
        if message.dequeue_count >= limit:
            return self._poison(leased)
        leased.release(0)

    def _run(self, registration: Registration, name: str) -> bool:
        spec, path = registration.spec, registration.path
        client = registration.source.container(path.container).get_blob_client(name)
        try:
            props = client.get_blob_properties()
        except ResourceNotFoundError:
            log.info("devhost.blob_skipped", function=spec.name, blob=name, outcome="deleted")
            return True
        params = path.match(name)
        if params is None:
            log.info("devhost.blob_skipped", function=spec.name, blob=name, outcome="path does not match the trigger")
            return True
        full = f"{path.container}/{name}"
        properties, metadata = blob_properties(props), dict(props.metadata or {})
        value = blob_trigger_argument(spec, client, full, props, properties, metadata,
                                      registration.source.connection_string)
        data = {**params, "BlobTrigger": full, "Uri": client.url, "Properties": properties, "Metadata": metadata}
        return self.invoker.invoke(spec, value, data).ok
