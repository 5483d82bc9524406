"""The Event Grid publisher (upwell.after.eventgrid) with the real azure-eventgrid client against the
recording server: one CloudEvent in a CloudEvents batch to /api/events, signed in with a bearer token for
Event Grid (no key: the topic has local auth off), and a refusal turned into DeliveryFailed."""

from __future__ import annotations

import json

import pytest

from upwell.after import cloudevents
from upwell.after.eventgrid import publish
from upwell.errors import DeliveryFailed

pytestmark = pytest.mark.afterjob
HTTP = {"enforce_https": False}  # the bearer-token policy's own switch, per request (the server is plain http)


def kwargs(client_kwargs: dict) -> dict:
    """The recording server's client settings that EventGridPublisherClient takes (it builds its own pipeline)."""
    return {k: v for k, v in client_kwargs.items() if k.startswith("retry_")}


EVENT = cloudevents.job_event("completed", "heat-0123456789ab", "ocean", {"job_id": "heat-0123456789ab"})


def test_publish_sends_one_cloudevent_with_a_bearer_token(server, credential, client_kwargs):
    server.route("POST", r"/api/events", (200,))
    publish(f"{server.url}/api/events", EVENT, credential, HTTP, **kwargs(client_kwargs))
    [req] = server.requests
    assert req.path == "/api/events" and req.q("api-version") == "2018-01-01"
    assert req.headers["Content-Type"].startswith("application/cloudevents-batch+json")
    assert req.headers["Authorization"] == "Bearer fake-token"
    assert credential.calls == [("https://eventgrid.azure.net/.default",)]
    assert not any(h.lower() in ("aeg-sas-key", "aeg-sas-token") for h in req.headers)
    body = req.body if isinstance(req.body, list) else json.loads(req.body)
    [sent] = body
    assert cloudevents.problems(sent) == []
    assert {k: sent[k] for k in ("id", "source", "type", "subject", "specversion")} == \
        {k: EVENT[k] for k in ("id", "source", "type", "subject", "specversion")}
    assert sent["data"] == EVENT["data"] and sent["type"] == "io.upwell.job.completed"


def test_a_refusal_is_delivery_failed(server, credential, client_kwargs):
    server.route("POST", r"/api/events", (403, {"error": {"code": "Forbidden", "message": "no role"}}))
    with pytest.raises(DeliveryFailed) as exc:
        publish(f"{server.url}/api/events", EVENT, credential, HTTP, **kwargs(client_kwargs))
    assert exc.value.status == 403
