"""Event Grid-sourced blob triggers in the devhost, as the Storage extension runs them on Flex Consumption.

A small app with one ``source=EventGrid`` blob trigger (SDK-type ``BlobClient``)
runs against the session Azurite: the local publisher turns new blobs into
BlobCreated events and POSTs them to the blobs webhook with the system key; the
webhook enqueues the extension's message on the host queue; failures retry at
once up to ``poisonBlobThreshold`` and then go to ``webjobs-blobtrigger-poison``.
No receipts are written. Faults on the event path (401, 5xx) and
``functionTimeout`` are checked here too.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import azure.functions as func
import azurefunctions.extensions.bindings.blob as blob_sdk
import pytest
from azure.storage.blob import BlobClient, BlobServiceClient
from azure.storage.queue import QueueServiceClient

from upwell.local.devhost import DevHost
from upwell.local.devhost.blobqueue import queue_settings
from upwell.local.devhost.clients import HostStorage
from upwell.local.devhost.publisher import EventFaults
from upwell.local.devhost.subscriptions import NO_RETRY_STATUS, read_template
from upwell.local.devhost.webhook import blob_trigger_message, system_key
from upwell.names import BLOB_POISON_QUEUE, EVENTGRID_DEADLETTER, HOST_RECEIPTS, blob_trigger_queue

REPO = Path(__file__).resolve().parents[2]
CALLS: list[dict] = []
SLOW = threading.Event()  # set: on_event for a "slow" blob holds until RELEASE, past the function timeout
RELEASE = threading.Event()  # the test lets a held on_event finish; never set while it runs: only a cancel ends it
ENDED: list[str] = []  # every held on_event that ended, however it ended

bp = func.Blueprint()


@bp.function_name("on_event")
@bp.blob_trigger(arg_name="client", path="%T_IN%/{name}", connection="AzureWebJobsStorage",
                 source=func.BlobSource.EVENT_GRID)
def on_event(client: blob_sdk.BlobClient) -> None:
    CALLS.append({"type": type(client).__name__, "is_sdk": isinstance(client, BlobClient), "name": client.blob_name})
    if SLOW.is_set() and "slow" in client.blob_name:
        try:
            while not RELEASE.is_set():  # short sleeps, so that the host's cancellation lands
                time.sleep(0.01)
            CALLS.append({"name": client.blob_name, "finished": True})
        finally:
            ENDED.append(client.blob_name)
    if "fail" in client.blob_name:
        raise RuntimeError("this blob asks to fail")


app = func.FunctionApp()
app.register_functions(bp)


def host_json(**blobs) -> dict:
    return {"version": "2.0", "functionTimeout": "00:00:01.5",
            "extensions": {"queues": {"maxPollingInterval": "00:00:00.2", "messageEncoding": "none"},
                           "blobs": {"maxDegreeOfParallelism": 4, **blobs}}}


@pytest.fixture
def world(azurite, monkeypatch):
    """Per-test container and host id; the connection is also in the environment, as on Azure."""
    monkeypatch.setenv("AzureWebJobsStorage", azurite.connection_string)
    CALLS.clear()
    SLOW.clear()
    RELEASE.clear()
    ENDED.clear()
    tag = uuid.uuid4().hex[:8]
    blobs = BlobServiceClient.from_connection_string(azurite.connection_string)
    blobs.create_container(f"in-{tag}")
    hosts: list[DevHost] = []

    def make(**overrides) -> DevHost:
        options = {"connection_string": azurite.connection_string, "host_json": host_json(), "port": None,
                   "settings": {"T_IN": f"in-{tag}"}, "host_id": f"eg-{tag}", "poll_interval": 0.1,
                   "shutdown_grace": 5.0, "script_root": REPO} | overrides
        host = DevHost(app, **options)
        hosts.append(host)
        return host

    world = type("World", (), {})()
    world.tag, world.blobs, world.make, world.container = tag, blobs, make, f"in-{tag}"
    world.queues = QueueServiceClient.from_connection_string(azurite.connection_string)
    world.conn = azurite.connection_string
    yield world
    RELEASE.set()  # a held call that was never cancelled (the test failed) ends now
    for host in hosts:
        if not host.stopping.is_set():
            host.stop()


def upload(world, name: str, data: bytes = b"x") -> str:
    return world.blobs.get_blob_client(world.container, name).upload_blob(data, overwrite=True)["etag"]


def poison_messages(world) -> list[dict]:
    client = world.queues.get_queue_client(BLOB_POISON_QUEUE)
    try:
        docs = [json.loads(m.content) for m in client.peek_messages(max_messages=32)]
    except Exception:  # noqa: BLE001 - not created yet
        return []
    # The poison queue is the account's, shared with other tests' hosts: only this world's container.
    return [d for d in docs if d.get("ContainerName") == world.container]


def test_subscription_template_is_read_from_events_bicep():
    template = read_template(REPO)
    sub = template.subscription("ingest", "incoming")
    text = (REPO / "bicep/modules/events.bicep").read_text()
    assert f"maxDeliveryAttempts: {sub.max_delivery_attempts}" in text
    assert f"eventTimeToLiveInMinutes: {sub.ttl_minutes}" in text
    assert sub.subject_begins_with == "/blobServices/default/containers/incoming/"
    assert sub.name == "blob-ingest" and sub.dead_letter_container == EVENTGRID_DEADLETTER
    assert sub.included_event_types == ("Microsoft.Storage.BlobCreated",)
    assert sub.retry_delay(1) == 10 and sub.retry_delay(3) == 60 and sub.retry_delay(30) is None
    assert {400, 401, 403, 413} == NO_RETRY_STATUS
    # collect's subscription: main.bicep's per-trigger suffix; subjects compare without case (Event Grid's default).
    results = template.subscription("collect", "results")
    assert (sub.subject_ends_with, results.subject_ends_with) == ("", ".json")
    subject = "/blobServices/default/containers/results/blobs/j1/s1"
    assert results.matches(sub.included_event_types[0], subject + ".json")
    assert results.matches(sub.included_event_types[0], subject.upper() + ".JSON")
    assert not results.matches(sub.included_event_types[0], subject + "/out.log")


def test_blobs_options_map_to_the_extensions_queue_options():
    # BlobsOptionsToQueuesOptions in the extension: (parallelism) -> (batch, threshold); threshold -> dequeue.
    for dop, batch, threshold in ((16, 9, 7), (100, 32, 68), (3, 2, 1), (1, 1, 0)):
        q = queue_settings(dop, 4, 1.0, "none")
        assert (q.batch_size, q.new_batch_threshold, q.max_dequeue_count, q.visibility_timeout) == (
            batch, threshold, 4, 0.0)


def test_webhook_checks_the_key_answers_the_handshake_and_enqueues_the_extensions_message(world):
    host = world.make()
    hook = host.webhook
    key = system_key(HostStorage(world.conn), host.host_id)
    assert key == hook.key and len(key) > 30
    target = f"/runtime/webhooks/blobs?functionName=Host.Functions.on_event&code={key}"
    event = {"eventType": "Microsoft.Storage.BlobCreated", "subject": "/blobServices/default/containers/c/blobs/a/b",
             "data": {"url": "http://127.0.0.1:10000/devstoreaccount1/c/a/b", "eTag": "0x8D1", "blobType": "BlockBlob"}}
    assert hook.handle("POST", target.replace(key, "nope"), {}, json.dumps([event]).encode())[0] == 401
    validation = [{"eventType": "Microsoft.EventGrid.SubscriptionValidationEvent", "data": {"validationCode": "abc"}}]
    status, _, body = hook.handle("POST", target, {"aeg-event-type": "SubscriptionValidation"},
                                  json.dumps(validation).encode())
    assert (status, json.loads(body)) == (200, {"validationResponse": "abc"})
    status, _, _ = hook.handle("POST", target, {"aeg-event-type": "Notification"}, json.dumps([event]).encode())
    assert status == 202
    queued = world.queues.get_queue_client(blob_trigger_queue(host.host_id)).peek_messages(max_messages=5)
    assert [json.loads(m.content) for m in queued] == [
        {"Type": "BlobTrigger", "FunctionId": "Host.Functions.on_event", "BlobType": "Block",
         "ContainerName": "c", "BlobName": "a/b", "ETag": '"0x8D1"'}]
    assert blob_trigger_message(dict(event, data={**event["data"], "url": "https://acct.blob.core.windows.net/c/x"}),
                                "f")["BlobName"] == "x"


def test_a_new_blob_runs_once_with_an_sdk_client_and_writes_no_receipt(world):
    host = world.make()
    host.run_until_idle()  # creates the subscription (handshake); nothing there yet
    upload(world, "dir/one.txt")
    host.run_until_idle()
    assert CALLS == [{"type": "BlobClient", "is_sdk": True, "name": "dir/one.txt"}]
    assert host.publisher.stats["delivered"] == 1
    receipts = world.blobs.get_container_client(HOST_RECEIPTS)
    assert not receipts.exists() or not [b.name for b in receipts.list_blobs(name_starts_with="blobreceipts/")
                                         if host.host_id in b.name]
    host.run_until_idle()
    assert len(CALLS) == 1, "a published blob version gets one event"


def test_blobs_written_before_the_subscription_existed_get_no_event(world):
    upload(world, "early.txt")
    time.sleep(1.1)  # last-modified has one-second resolution
    host = world.make()
    host.run_until_idle()
    upload(world, "later.txt")
    host.run_until_idle()
    assert [c["name"] for c in CALLS] == ["later.txt"]


def test_a_failing_blob_retries_at_once_then_poisons_with_the_extensions_message(world):
    host = world.make(host_json=host_json(poisonBlobThreshold=3))
    host.run_until_idle()
    etag = upload(world, "always-fail.txt")
    tries = []  # calls so far, after each round of receives
    while len(tries) < 10 and len(CALLS) < 3:
        host.run_once()
        tries.append(len(CALLS))
    # No delay between tries: from the first try on, every next receive finds the message again.
    assert tries[tries.index(1):] == [1, 2, 3], tries
    assert host.run_until_idle() == 0 and [c["name"] for c in CALLS] == ["always-fail.txt"] * 3
    assert poison_messages(world) == [{"Type": "BlobTrigger", "FunctionId": "Host.Functions.on_event",
                                       "BlobType": "Block", "ContainerName": world.container,
                                       "BlobName": "always-fail.txt", "ETag": etag}]


def test_a_401_dead_letters_the_event_at_once(world):
    host = world.make(event_faults=EventFaults(fail_401=1.0, seed=1))
    host.run_until_idle()
    upload(world, "locked-out.txt")
    host.run_until_idle()
    assert CALLS == []
    dead = world.blobs.get_container_client(EVENTGRID_DEADLETTER)
    docs = [json.loads(dead.get_blob_client(b.name).download_blob().readall()) for b in dead.list_blobs()]
    mine = [d[0] for d in docs if d[0]["subject"].endswith(f"/containers/{world.container}/blobs/locked-out.txt")]
    assert len(mine) == 1
    assert (mine[0]["lastHttpStatusCode"], mine[0]["deliveryAttempts"]) == (401, 1)
    assert mine[0]["eventType"] == "Microsoft.Storage.BlobCreated"


def test_5xx_deliveries_are_retried_on_the_schedule_until_delivered(world):
    faults = EventFaults(fail_5xx=1.0, retry_scale=0.01, seed=2)
    host = world.make(event_faults=faults)
    host.run_until_idle()
    upload(world, "flaky.txt")
    host.run_once()
    assert CALLS == [] and host.publisher.stats["retried"] >= 1
    host.publisher.set_faults(EventFaults(retry_scale=0.01))
    deadline = time.monotonic() + 10
    while not CALLS and time.monotonic() < deadline:
        time.sleep(0.1)
        host.run_once()
    assert [c["name"] for c in CALLS] == ["flaky.txt"]


def test_the_function_timeout_cancels_the_invocation_and_counts_a_failure(world):
    SLOW.set()
    host = world.make(host_json=host_json(poisonBlobThreshold=2))
    host.run_until_idle()
    upload(world, "slow.txt")
    host.run_until_idle()
    failed = [r for r in host.invocations if r.function == "on_event"]
    assert [r.outcome for r in failed] == ["failed", "failed"]
    assert all("FunctionTimeoutError" in r.error for r in failed)
    assert all(r.duration_s >= 1.5 for r in failed)  # cancelled at functionTimeout, not before
    # Both calls were held until RELEASE, which is not set yet: only the host's cancellation can end them.
    deadline = time.monotonic() + 10
    while len(ENDED) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ENDED == ["slow.txt", "slow.txt"], "a cancelled invocation still runs"
    RELEASE.set()
    assert not [c for c in CALLS if c.get("finished")], "the cancelled invocation did not run on"
    assert [m["BlobName"] for m in poison_messages(world) if m["ContainerName"] == world.container] == ["slow.txt"]


def test_over_http_the_publisher_posts_to_the_webhook(world):
    host = world.make(port=0)
    host.start()
    deadline = time.monotonic() + 15
    while not host.publisher.subscribed and time.monotonic() < deadline:
        time.sleep(0.1)
    upload(world, "over-http.txt")
    deadline = time.monotonic() + 15
    while not CALLS and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [c["name"] for c in CALLS] == ["over-http.txt"]
    assert host.publisher.stats["delivered"] >= 1
