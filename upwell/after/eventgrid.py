"""Publishing a job event to the Event Grid custom topic that bicep/after.bicep creates.

Followed: azure-eventgrid's ``EventGridPublisherClient(endpoint, credential)`` for an Event Grid Basic
topic (``send`` of ``azure.core.messaging.CloudEvent`` objects POSTs a JSON array to ``/api/events``
with ``application/cloudevents-batch+json``) and the custom topic's Microsoft Entra sign-in: a
``DefaultAzureCredential`` (the Function App's managed identity, which holds "EventGrid Data Sender" on
the topic), the token scoped to ``https://eventgrid.azure.net/.default``; the topic has
``disableLocalAuth: true``, so no access key exists to use.
"""

from __future__ import annotations

from typing import Any

from upwell.errors import DeliveryFailed


def publish(endpoint: str, event: dict, credential: Any = None, send_kwargs: dict | None = None,
            **client_kwargs: Any) -> None:
    """Send one CloudEvent (a dict in the JSON format) to the topic; DeliveryFailed when it would not take
    it (the SDK has retried the transient answers already). ``send_kwargs``, ``client_kwargs``: passed to
    the SDK's send and client (the contract tests point them at a local server)."""
    from azure.core.exceptions import AzureError, HttpResponseError
    from azure.core.messaging import CloudEvent
    from azure.eventgrid import EventGridPublisherClient

    if credential is None:
        from azure.identity import DefaultAzureCredential

        credential = DefaultAzureCredential()
    client = EventGridPublisherClient(endpoint, credential, **client_kwargs)
    try:
        client.send([CloudEvent.from_dict(dict(event))], **(send_kwargs or {}))
    except HttpResponseError as exc:
        raise DeliveryFailed(f"Event Grid topic refused the event: HTTP {exc.status_code} "
                             f"{(exc.reason or '')[:200]}", status=exc.status_code) from None
    except AzureError as exc:
        raise DeliveryFailed(f"Event Grid topic: {type(exc).__name__}: {str(exc)[:200]}") from None
    finally:
        client.close()
