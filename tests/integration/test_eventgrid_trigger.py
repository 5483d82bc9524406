"""Event Grid triggers in the devhost, as the Event Grid extension runs them (collect is one).

A small app with one ``eventGridTrigger`` function runs against the session Azurite. Its subscription comes
from a Bicep template of the project's shape (an entry of main.bicep's ``blobTriggers`` with ``webhook:
'eventgrid'`` and a ``.json`` suffix, and the project's own events.bicep), so the template reader is the one
the real app uses. The local publisher POSTs each BlobCreated event to ``/runtime/webhooks/eventgrid`` with
the ``eventgrid_extension`` key; the function runs inside the delivery and the answer is 202, or 500 when it
failed, which Event Grid retries on its schedule and then dead-letters. No host queue is touched.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import uuid
from pathlib import Path

import azure.functions as func
import pytest
from azure.storage.blob import BlobServiceClient
from azure.storage.queue import QueueServiceClient

from upwell.local.devhost import DevHost
from upwell.local.devhost.clients import HostStorage
from upwell.local.devhost.eventgrid import SYSTEM_KEY
from upwell.local.devhost.publisher import EventFaults
from upwell.local.devhost.webhook import system_key
from upwell.names import EVENTGRID_DEADLETTER, blob_trigger_queue

REPO = Path(__file__).resolve().parents[2]
CALLS: list[dict] = []
FAIL_FIRST: dict[str, int] = {}  # blob name -> failures still to raise
LOCK = threading.Lock()

bp = func.Blueprint()


@bp.function_name("on_grid")
@bp.event_grid_trigger(arg_name="event")
def on_grid(event: func.EventGridEvent) -> None:
    name = event.subject.rsplit("/blobs/", 1)[-1]
    with LOCK:
        CALLS.append({"type": type(event).__name__, "name": name, "event_type": event.event_type,
                      "etag": event.get_json().get("eTag"), "url": event.get_json().get("url")})
        if FAIL_FIRST.get(name, 0) > 0:
            FAIL_FIRST[name] -= 1
            raise RuntimeError(f"{name} asks to fail")


app = func.FunctionApp()
app.register_functions(bp)

MAIN = """var blobTriggers = [
  {
    function: 'on_grid'
    container: '%s'
    subjectEndsWith: '.json'
    webhook: 'eventgrid'
  }
]
var deadLetterContainerName = 'eventgrid-deadletter'
"""


@pytest.fixture
def world(azurite, monkeypatch, tmp_path):
    """Per-test container, host id and script root (the project's events.bicep and a main.bicep naming the
    test's container); the connection is also in the environment, as on Azure."""
    monkeypatch.setenv("AzureWebJobsStorage", azurite.connection_string)
    CALLS.clear()
    FAIL_FIRST.clear()
    tag = uuid.uuid4().hex[:8]
    container = f"grid-{tag}"
    root = tmp_path / "root"
    (root / "bicep" / "modules").mkdir(parents=True)
    shutil.copy(REPO / "bicep" / "modules" / "events.bicep", root / "bicep" / "modules" / "events.bicep")
    (root / "bicep" / "main.bicep").write_text(MAIN % container)
    blobs = BlobServiceClient.from_connection_string(azurite.connection_string)
    blobs.create_container(container)
    hosts: list[DevHost] = []

    def make(**overrides) -> DevHost:
        options = {"connection_string": azurite.connection_string, "port": None, "host_id": f"egt-{tag}",
                   "poll_interval": 0.1, "shutdown_grace": 5.0, "script_root": root,
                   "host_json": {"version": "2.0", "functionTimeout": "00:00:05"}} | overrides
        host = DevHost(app, **options)
        hosts.append(host)
        return host

    world = type("World", (), {})()
    world.blobs, world.make, world.container, world.conn = blobs, make, container, azurite.connection_string
    yield world
    for host in hosts:
        if not host.stopping.is_set():
            host.stop()


def upload(world, name: str, data: bytes = b"{}") -> str:
    return world.blobs.get_blob_client(world.container, name).upload_blob(data, overwrite=True)["etag"]


def test_the_webhook_checks_the_key_names_the_function_and_answers_as_the_extension(world):
    host = world.make()
    hook = host.eventgrid_webhook
    key = system_key(HostStorage(world.conn), host.host_id, SYSTEM_KEY)
    assert key == hook.key and len(key) > 30 and key != system_key(HostStorage(world.conn), host.host_id)
    target = f"/runtime/webhooks/eventgrid?functionName=on_grid&code={key}"
    event = {"id": "1", "topic": "t", "eventType": "Microsoft.Storage.BlobCreated", "eventTime": "2026-12-03T10:00:00Z",
             "subject": f"/blobServices/default/containers/{world.container}/blobs/a/b.json", "dataVersion": "",
             "data": {"url": "http://127.0.0.1:10000/devstoreaccount1/c/a/b.json", "eTag": "0x8D1"}}
    notify = {"aeg-event-type": "Notification"}
    assert hook.handle("POST", target.replace(key, "nope"), notify, json.dumps([event]).encode())[0] == 401
    missing = hook.handle("POST", target.replace("on_grid", "nothing"), notify, b"[]")
    assert missing[0] == 404 and b"cannot find function: 'nothing'" in missing[2]
    validation = [{"eventType": "Microsoft.EventGrid.SubscriptionValidationEvent", "data": {"validationCode": "abc"}}]
    status, _, body = hook.handle("POST", target, {"aeg-event-type": "SubscriptionValidation"},
                                  json.dumps(validation).encode())
    assert (status, json.loads(body)) == (200, {"validationResponse": "abc"})
    assert hook.handle("POST", target, {"aeg-event-type": "Unsubscribe"}, b"[]")[0] == 202
    assert hook.handle("POST", target, {"aeg-event-type": "Other"}, b"[]")[0] == 400
    assert hook.handle("POST", target, notify, json.dumps(event).encode())[0] == 202  # one event, not an array
    assert [{"type": "EventGridEvent", "name": "a/b.json", "event_type": "Microsoft.Storage.BlobCreated",
                      "etag": "0x8D1", "url": event["data"]["url"]}] == CALLS
    FAIL_FIRST["a/b.json"] = 1
    status, _, body = hook.handle("POST", target, notify, json.dumps([event]).encode())
    assert status == 500 and b"a/b.json asks to fail" in body


def test_a_new_result_runs_the_function_inside_the_delivery_with_no_host_queue(world):
    """The suffix filter passes only ``.json``; each blob version runs once; nothing goes on a host queue."""
    host = world.make()
    host.run_until_idle()  # the subscription's handshake, on the Event Grid webhook
    assert host.publisher.subscribed and host.webhook is None and host.blob_queue is None
    etag = upload(world, "job/s00000.json")
    upload(world, "job/s00000/payload.log", b"log")
    host.run_until_idle()
    assert [(c["name"], c["etag"]) for c in CALLS] == [("job/s00000.json", etag.strip('"'))]
    assert host.publisher.stats["delivered"] == 1
    host.run_until_idle()
    assert len(CALLS) == 1, "a published blob version gets one event"
    queues = QueueServiceClient.from_connection_string(world.conn)
    assert blob_trigger_queue(host.host_id) not in {q.name for q in queues.list_queues()}
    records = [r for r in host.invocations if r.function == "on_grid"]
    assert [(r.trigger, r.outcome) for r in records] == [("eventGridTrigger", "succeeded")]


def test_a_failing_function_is_retried_by_event_grid_then_dead_lettered(world):
    """500 is retried on Event Grid's schedule (scaled down here): a function that fails twice runs a third
    time; one that never succeeds is dead-lettered once its attempts run out (``maxDeliveryAttempts`` 30)."""
    host = world.make(event_faults=EventFaults(retry_scale=0.00001))
    host.run_until_idle()
    FAIL_FIRST.update({"twice.json": 2, "always.json": 10**6})
    upload(world, "twice.json")
    upload(world, "always.json")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (host.publisher.pending or not CALLS):
        host.run_once()
        time.sleep(0.02)
    tries = [c["name"] for c in CALLS]
    assert tries.count("twice.json") == 3 and tries.count("always.json") == 30, tries
    dead = world.blobs.get_container_client(EVENTGRID_DEADLETTER)
    docs = [json.loads(dead.get_blob_client(b.name).download_blob().readall())[0] for b in dead.list_blobs()]
    mine = [d for d in docs if d["subject"].endswith(f"/containers/{world.container}/blobs/always.json")]
    assert [(d["deadLetterReason"], d["lastHttpStatusCode"], d["deliveryAttempts"]) for d in mine] == [
        ("MaxDeliveryAttemptsExceeded", 500, 30)]


def test_over_http_the_publisher_posts_to_the_eventgrid_webhook(world):
    host = world.make(port=0)
    host.start()
    deadline = time.monotonic() + 15
    while not host.publisher.subscribed and time.monotonic() < deadline:
        time.sleep(0.1)
    upload(world, "http.json")
    while not CALLS and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [c["name"] for c in CALLS] == ["http.json"]
    host.stop()
