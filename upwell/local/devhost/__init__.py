"""upwell.local.devhost: a local Azure Functions host that drives the real ``function_app.app``.

The Functions host cannot be installed here, so the devhost loads the Python v2
app (``func.FunctionApp`` with blueprints) and drives its triggers against
Azure Storage, which is Azurite on this machine:

* ``source=EventGrid`` blob triggers as the Storage extension runs them on Flex
  Consumption: a local stand-in for the Event Grid topic (``publisher``, with the
  subscriptions of ``bicep/modules/events.bicep``: ``subscriptions``) posts
  BlobCreated events to the blobs webhook (``webhook``), which fills the host queue
  that ``blobqueue`` runs (``poisonBlobThreshold``, ``webjobs-blobtrigger-poison``);
* other blob triggers by polling, with the host's receipts in ``azure-webjobs-hosts``
  and its ``webjobs-blobtrigger-poison`` queue (``blobs``);
* queue triggers with host.json ``extensions.queues`` (``queues``);
* timer triggers on NCRONTAB schedules (``timers``, ``upwell.ncrontab``);
* HTTP triggers on 127.0.0.1 (``web``);
* queue and blob output bindings, blob input bindings, SDK-type blob bindings
  (``BlobClient``), ``context`` and ``functionTimeout`` (``invoke``).

This package is the one part of ``upwell`` that imports ``azure.functions``: it
builds the same argument objects the Python worker builds.
Run it with ``python -m upwell.local.devhost``; in tests, use ``DevHost``.
"""

from upwell.local.devhost.app import FunctionSpec, load_functions
from upwell.local.devhost.clients import MessageCodec
from upwell.local.devhost.config import AppSettings, HostConfig, QueueSettings, load_local_settings
from upwell.local.devhost.host import DevHost
from upwell.local.devhost.invoke import InvocationRecord, Outcome

__all__ = ["AppSettings", "DevHost", "FunctionSpec", "HostConfig", "InvocationRecord", "MessageCodec", "Outcome",
           "QueueSettings", "load_functions", "load_local_settings"]
