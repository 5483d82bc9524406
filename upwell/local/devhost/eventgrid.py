"""The Event Grid extension webhook: ``POST /runtime/webhooks/eventgrid?functionName=<fn>&code=<key>``.

What the Event Grid extension does with a delivery (azure-sdk-for-net,
``Microsoft.Azure.WebJobs.Extensions.EventGrid``: ``EventGridExtensionConfigProvider.ProcessAsync`` and
``HttpRequestProcessor.ProcessAsync``):

* the host checks ``code`` against its ``eventgrid_extension`` system key first (401 otherwise);
* a ``functionName`` that names no Event Grid-triggered function is 404 ("cannot find function");
* ``aeg-event-type: SubscriptionValidation`` is answered 200 with ``{"validationResponse": <code>}``;
* ``aeg-event-type: Notification``: the body is an event or an array of events; a function that takes one
  event (single dispatch, as a Python ``func.EventGridEvent`` parameter does) runs once per event, all of
  them at once, and the answer is 202 when every run succeeded and 500 (the first failure's message)
  otherwise, which makes Event Grid resend the whole delivery;
* ``Unsubscribe`` is 202; any other event type is 400.

The function runs inside the delivery: unlike a blob trigger, no host queue, no message and no blob read
stand between the event and the function. Event Grid's own retry schedule, its 30-second wait for an answer
and its dead-lettering apply to the failures (``upwell.local.devhost.publisher``).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

import azure.functions as func
import structlog

from upwell.local.devhost.app import FunctionSpec
from upwell.local.devhost.clients import HostStorage
from upwell.local.devhost.invoke import Outcome
from upwell.local.devhost.webhook import KeyedWebhook

log = structlog.get_logger("upwell.local.devhost")
PATH = "/runtime/webhooks/eventgrid"
SYSTEM_KEY = "eventgrid_extension"
TRIGGER = "eventGridTrigger"


def event_argument(event: Mapping) -> func.EventGridEvent:
    """The ``func.EventGridEvent`` the Python worker hands a function for one Event Grid-schema event."""
    return func.EventGridEvent(
        id=str(event.get("id", "")), data=event.get("data") or {}, topic=str(event.get("topic", "")),
        subject=str(event.get("subject", "")), event_type=str(event.get("eventType", "")),
        event_time=_time(event.get("eventTime")), data_version=str(event.get("dataVersion", "")))


def _time(text: object) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(str(text).replace("Z", "+00:00")) if text else None
    except ValueError:
        return None


class EventGridWebhook(KeyedWebhook):
    """Answers Event Grid deliveries for this host's Event Grid-triggered functions by running them.

    ``invoke(spec, event, trigger_data)`` runs one function (the host's invoker); the ``eventgrid_extension`` key.
    """

    key_name = SYSTEM_KEY

    def __init__(self, hosts: HostStorage, host_id: str, specs: list[FunctionSpec],
                 invoke: Callable[[FunctionSpec, func.EventGridEvent, dict], Outcome]) -> None:
        super().__init__(hosts, host_id)
        self.invoke = invoke
        self.specs = {s.name: s for s in specs}

    def handle(self, method: str, target: str, headers: dict[str, str], body: bytes) -> tuple[int, dict, bytes]:
        seen = self.admit(method, target, headers)
        if isinstance(seen, int):
            return seen, {}, b""
        params, lower = seen
        spec = self.specs.get(params.get("functionName", ""))
        if spec is None:
            text = f"cannot find function: '{params.get('functionName', '')}'"
            return 404, {"Content-Type": "text/plain; charset=utf-8"}, text.encode()
        kind = lower.get("aeg-event-type", "").lower()
        if kind == "unsubscribe":
            return 202, {}, b""
        if kind not in ("subscriptionvalidation", "notification"):
            return 400, {}, b""
        try:
            events = json.loads(body or b"[]")
        except ValueError:
            return 400, {}, b""
        events = events if isinstance(events, list) else [events]
        if kind == "subscriptionvalidation":
            code = events[0]["data"]["validationCode"] if events else ""
            log.info("devhost.eventgrid_handshake", function=spec.name)
            return 200, {"Content-Type": "application/json"}, json.dumps({"validationResponse": code}).encode()
        return self._run(spec, [e for e in events if isinstance(e, dict)])

    def _run(self, spec: FunctionSpec, events: list[dict]) -> tuple[int, dict, bytes]:
        """Each event its own invocation, all at once; 202 only when every one succeeded."""
        def one(event: dict) -> Outcome:
            return self.invoke(spec, event_argument(event), {"data": event.get("data") or {}})
        if len(events) == 1:
            outcomes = [one(events[0])]
        else:
            with ThreadPoolExecutor(max(1, len(events)), thread_name_prefix="devhost-eventgrid-run") as pool:
                outcomes = list(pool.map(one, events))
        for outcome in outcomes:
            if not outcome.ok:
                message = f"{type(outcome.error).__name__}: {outcome.error}"[:1000]
                return 500, {"Content-Type": "text/plain; charset=utf-8"}, message.encode()
        return 202, {}, b""
