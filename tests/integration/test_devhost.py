"""The devhost drives a real FunctionApp against real Azurite.

The app below is a small blueprint whose functions record each call in
``EVENTS``. Container and queue names come from ``%T_...%`` app settings, so
that each test gets its own names on the one session Azurite.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import azure.functions as func
import pytest
from azure.core.exceptions import ResourceExistsError
from azure.storage.blob import BlobServiceClient
from azure.storage.queue import QueueClient, QueueServiceClient

from upwell.errors import ConfigError
from upwell.local.azurite import REPO, Azurite
from upwell.local.devhost import AppSettings, DevHost, HostConfig, MessageCodec, load_functions, load_local_settings
from upwell.local.devhost.web import compile_route
from upwell.names import BLOB_POISON_QUEUE, HOST_RECEIPTS

# --- the test app ---------------------------------------------------------------------------

EVENTS: list[dict] = []
_events_lock = threading.Lock()
TIMER_GATE = threading.Event()  # cleared: on_timer waits on it (up to 5 s)


class Gauge:
    """How many calls run at once, and the most at any moment."""

    def __init__(self) -> None:
        self.now = self.peak = 0
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        with self._lock:
            self.now += 1
            self.peak = max(self.peak, self.now)

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.now -= 1


QUEUE_GAUGE, TIMER_GAUGE = Gauge(), Gauge()


class Valve:
    """Where a held message waits: each ``let(n)`` lets n of the waiting calls through, ``open()`` all of them.
    The test decides when calls finish, so what runs at once does not depend on the machine's speed."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.tokens, self.opened = 0, False

    def wait(self, timeout: float = 30.0) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self.opened or self.tokens > 0, timeout):
                raise TimeoutError("the valve was never opened")
            if not self.opened:
                self.tokens -= 1

    def let(self, n: int) -> None:
        with self._cond:
            self.tokens += n
            self._cond.notify_all()

    def open(self) -> None:
        with self._cond:
            self.opened = True
            self._cond.notify_all()

    def reset(self) -> None:
        with self._cond:
            self.tokens, self.opened = 0, False


QUEUE_VALVE = Valve()


def record(function: str, **fields: object) -> None:
    with _events_lock:
        EVENTS.append({"function": function, "at": time.monotonic(), **fields})


def events(function: str, **match: object) -> list[dict]:
    with _events_lock:
        return [e for e in EVENTS if e["function"] == function and all(e.get(k) == v for k, v in match.items())]


bp = func.Blueprint()


# No `source`: a polling blob trigger with receipts (Event Grid-sourced ones: tests/integration/test_eventgrid.py).
@bp.blob_trigger(arg_name="blob", path="%T_BLOBS%/{name}", connection="AzureWebJobsStorage")
@bp.queue_output(arg_name="out", queue_name="%T_OUT%", connection="AzureWebJobsStorage")
def on_blob(blob: func.InputStream, out: func.Out[str]) -> None:
    data = blob.read()
    record("on_blob", name=blob.name, length=blob.length, uri=blob.uri, data=data,
           etag=(blob.blob_properties or {}).get("ETag"))
    if b"fail" in data:
        raise RuntimeError("this blob asks to fail")
    out.set(json.dumps({"key": blob.name, "from": "on_blob"}))


@bp.queue_trigger(arg_name="msg", queue_name="%T_QUEUE%", connection="AzureWebJobsStorage")
@bp.blob_output(arg_name="result", path="%T_RESULTS%/{key}.json", connection="AzureWebJobsStorage")
def on_message(msg: func.QueueMessage, result: func.Out[str]) -> None:
    body = msg.get_json()
    record("on_message", key=body["key"], dequeue_count=msg.dequeue_count, id=msg.id,
           pop_receipt=msg.pop_receipt, inserted=msg.insertion_time, expires=msg.expiration_time,
           thread=threading.get_ident())
    with QUEUE_GAUGE:
        if body.get("hold"):
            QUEUE_VALVE.wait()
    if body.get("always_fail") or msg.dequeue_count < body.get("fail_until", 0):
        raise RuntimeError(f"message {body['key']} asks to fail")
    result.set(json.dumps({"key": body["key"], "dequeue_count": msg.dequeue_count}))


@bp.timer_trigger(arg_name="timer", schedule="%T_SCHEDULE%", run_on_startup=True, use_monitor=False)
def on_timer(timer: func.TimerRequest) -> None:
    record("on_timer", past_due=timer.past_due, status=timer.schedule_status)
    with TIMER_GAUGE:
        TIMER_GATE.wait(5)


@bp.route(route="echo/{item}", methods=["GET", "POST"], auth_level=func.AuthLevel.ANONYMOUS)
def echo(req: func.HttpRequest) -> func.HttpResponse:
    if req.params.get("boom"):
        raise ValueError("boom")
    payload = {"item": req.route_params["item"], "params": dict(req.params), "method": req.method,
               "body": req.get_body().decode(), "url": req.url}
    return func.HttpResponse(json.dumps(payload), status_code=201, mimetype="application/json")


app = func.FunctionApp()
app.register_functions(bp)

HOST_JSON = {"version": "2.0", "functionTimeout": "00:05:00", "extensions": {
    "queues": {"batchSize": 4, "newBatchThreshold": 2, "maxDequeueCount": 5, "visibilityTimeout": "00:00:00",
               "maxPollingInterval": "00:00:00.2", "messageEncoding": "none"},
    "blobs": {"maxDegreeOfParallelism": 4}}}
FAR_AWAY = "0 0 0 1 1 *"
DEV = "UseDevelopmentStorage=true"  # parsed, never dialled, by the tests that build a host without running it

# --- fixtures and helpers -------------------------------------------------------------------


@dataclass
class Names:
    blobs: str
    out: str
    queue: str
    results: str
    host_id: str
    schedule: str = FAR_AWAY

    @property
    def settings(self) -> dict[str, str]:
        return {"T_BLOBS": self.blobs, "T_OUT": self.out, "T_QUEUE": self.queue, "T_RESULTS": self.results,
                "T_SCHEDULE": self.schedule}


@pytest.fixture
def names() -> Names:
    EVENTS.clear()
    QUEUE_GAUGE.peak = TIMER_GAUGE.peak = 0
    QUEUE_VALVE.reset()
    TIMER_GATE.set()
    tag = uuid.uuid4().hex[:10]
    return Names(f"in-{tag}", f"out-{tag}", f"q-{tag}", f"res-{tag}", f"host-{tag}")


@pytest.fixture
def make_host(azurite: Azurite, names: Names) -> Callable[..., DevHost]:
    hosts: list[DevHost] = []

    def make(**overrides: object) -> DevHost:
        options = {"connection_string": azurite.connection_string, "host_json": HOST_JSON, "port": None,
                   "settings": names.settings, "host_id": names.host_id, "poll_interval": 0.1,
                   "shutdown_grace": 5.0} | overrides
        host = DevHost(app, **options)
        hosts.append(host)
        return host

    yield make
    for host in hosts:
        if not host.stopping.is_set():
            host.stop()


@pytest.fixture
def blobs(azurite: Azurite) -> BlobServiceClient:
    return BlobServiceClient.from_connection_string(azurite.connection_string)


@pytest.fixture
def queues(azurite: Azurite) -> QueueServiceClient:
    return QueueServiceClient.from_connection_string(azurite.connection_string)


def upload(blobs: BlobServiceClient, container: str, name: str, data: bytes) -> str:
    client = blobs.get_container_client(container)
    if not client.exists():
        client.create_container()
    return client.get_blob_client(name).upload_blob(data, overwrite=True)["etag"]


def send(queues: QueueServiceClient, queue: str, body: dict | str) -> None:
    client = queues.get_queue_client(queue)
    with contextlib.suppress(ResourceExistsError):
        client.create_queue()
    client.send_message(body if isinstance(body, str) else json.dumps(body))


def drain(client: QueueClient) -> list[str]:
    return [m.content for m in client.receive_messages(max_messages=32, visibility_timeout=1)]


def eventually(predicate: Callable[[], object], timeout: float = 10.0) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not true within {timeout} s: {predicate}")

# --- loading and configuration (no storage I/O) ---------------------------------------------


def test_the_app_is_loaded_once_and_its_bindings_read() -> None:
    first, second = load_functions(app), load_functions(app)  # get_functions() would raise the 2nd time
    assert [s.name for s in first] == [s.name for s in second] == ["on_blob", "on_message", "on_timer", "echo"]
    by_name = {s.name: s for s in first}
    assert by_name["on_blob"].trigger["path"] == "%T_BLOBS%/{name}"
    assert "source" not in by_name["on_blob"].trigger or by_name["on_blob"].trigger["source"] != "EventGrid"
    assert [(b["type"], b["name"]) for b in by_name["on_blob"].outputs] == [("queue", "out")]
    assert [(b["type"], b["name"]) for b in by_name["on_message"].outputs] == [("blob", "result")]
    assert by_name["on_timer"].trigger["runOnStartup"] is True
    assert by_name["echo"].trigger["route"] == "echo/{item}"


def test_construction_resolves_settings_and_names_what_is_missing(names: Names) -> None:
    host = DevHost(app, connection_string=DEV, host_json=HOST_JSON, port=None,
                   settings=names.settings)
    assert host.blob_listeners[0].path.container == names.blobs
    assert host.queue_listeners[0].queue == names.queue
    assert host.config.queues.batch_size == 4 and host.config.queues.new_batch_threshold == 2
    with pytest.raises(ConfigError, match="app setting 'T_QUEUE'"):
        DevHost(app, connection_string=DEV, host_json=HOST_JSON, settings={"T_BLOBS": "a", "T_SCHEDULE": FAR_AWAY})
    bad = names.settings | {"T_SCHEDULE": "00:05:00"}
    with pytest.raises(ConfigError, match="on_timer: schedule '00:05:00' is a TimeSpan"):
        DevHost(app, connection_string=DEV, host_json=HOST_JSON, settings=bad)
    with pytest.raises(ConfigError, match=r"on_timer: '\* \* \* \* \*' has 5 fields"):
        DevHost(app, connection_string=DEV, host_json=HOST_JSON, settings=names.settings | {"T_SCHEDULE": "* * * * *"})
    with pytest.raises(ConfigError, match="connection 'AzureWebJobsStorage': Connection string is .* malformed"):
        DevHost(app, connection_string="x", host_json=HOST_JSON, settings=names.settings)
    with pytest.raises(ConfigError, match=r"no function \['nope'\]"):
        DevHost(app, connection_string=DEV, host_json=HOST_JSON, settings=names.settings, functions=["nope"])


def test_connections_and_local_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AzureWebJobsStorage", raising=False)
    monkeypatch.setenv("MYSTORE__serviceUri", "https://acct.blob.core.windows.net")
    settings = AppSettings({"AzureWebJobsOther": "UseDevelopmentStorage=true"})
    assert settings.connection_string("Other") == "UseDevelopmentStorage=true"
    with pytest.raises(ConfigError, match="identity based"):
        settings.connection_string("MYSTORE")
    with pytest.raises(ConfigError, match="set AzureWebJobsStorage"):
        settings.connection_string(None)
    (tmp_path / "local.settings.json").write_text(json.dumps({"IsEncrypted": False, "Values": {
        "AzureWebJobsStorage": "UseDevelopmentStorage=true", "UPWELL_POOLS": "from-file"}}))
    environ = {"UPWELL_POOLS": "from-env"}
    assert load_local_settings(tmp_path / "local.settings.json", environ)["UPWELL_POOLS"] == "from-file"
    assert environ == {"UPWELL_POOLS": "from-env", "AzureWebJobsStorage": "UseDevelopmentStorage=true"}
    assert load_local_settings(tmp_path / "absent.json", environ) == {}


def test_repo_host_json_is_read() -> None:
    config = HostConfig.load(REPO / "host.json")
    assert config.raw["extensionBundle"] == {"id": "Microsoft.Azure.Functions.ExtensionBundle",
                                             "version": "[4.*, 5.0.0)"}
    assert config.function_timeout == 30 * 60
    assert config.queues.max_dequeue_count == 5 and config.queues.visibility_timeout == 5
    assert config.queues.max_polling_interval == 2
    assert config.queues.new_batch_threshold < config.queues.batch_size
    with pytest.raises(ConfigError, match="visibilityTimeout: 'soon' is not a TimeSpan"):
        HostConfig.load({"version": "2.0", "extensions": {"queues": {"visibilityTimeout": "soon"}}})


@pytest.mark.parametrize("encoding", ["base64", "none"])
def test_message_codec_reads_both_and_writes_as_configured(encoding: str) -> None:
    codec = MessageCodec(encoding)
    text = json.dumps({"key": "é"})
    assert codec.decode(text) == text.encode()
    assert codec.decode(base64.b64encode(text.encode()).decode()) == text.encode()
    assert codec.decode("not base64!") == b"not base64!"
    assert codec.decode(base64.b64encode(b"\xff\xfe").decode()) == base64.b64encode(b"\xff\xfe")  # not UTF-8
    written = codec.encode(text)
    assert written == (base64.b64encode(text.encode()).decode() if encoding == "base64" else text)
    assert codec.decode(written) == text.encode()

# --- blob triggers --------------------------------------------------------------------------


def receipt_metadata(blobs: BlobServiceClient, names: Names, etag: str, name: str) -> dict[str, str]:
    path = f"blobreceipts/{names.host_id}/Host.Functions.on_blob/{etag}/{names.blobs}/{name}"
    return blobs.get_blob_client(HOST_RECEIPTS, path).get_blob_properties().metadata


def test_blob_runs_once_per_version_across_restarts(make_host, names, blobs, queues) -> None:
    etag = upload(blobs, names.blobs, "a/b/job.yaml", b"payload: x\n")
    upload(blobs, names.blobs, "other.txt", b"second")
    first = make_host()
    assert first.run_until_idle() == 2
    call = events("on_blob", name=f"{names.blobs}/a/b/job.yaml")[0]
    assert call["data"] == b"payload: x\n" and call["length"] == 11 and call["etag"] == etag
    assert call["uri"].endswith(f"/{names.blobs}/a/b/job.yaml")
    assert first.run_once() == 0
    assert receipt_metadata(blobs, names, etag, "a/b/job.yaml")["Outcome"] == "succeeded"
    out = sorted(json.loads(m)["key"] for m in drain(queues.get_queue_client(names.out)))
    assert out == [f"{names.blobs}/a/b/job.yaml", f"{names.blobs}/other.txt"]  # the queue output, plain JSON

    second = make_host()  # a restart: same host id, empty memory, the receipts are in storage
    assert second.run_until_idle() == 0
    new_etag = upload(blobs, names.blobs, "a/b/job.yaml", b"payload: y\n")
    assert new_etag != etag
    assert second.run_until_idle() == 1
    assert [e["data"] for e in events("on_blob", name=f"{names.blobs}/a/b/job.yaml")] == [b"payload: x\n",
                                                                                          b"payload: y\n"]
    assert [r.outcome for r in first.invocations + second.invocations] == ["succeeded"] * 3


def test_two_hosts_never_run_one_blob_version_both(make_host, names, blobs) -> None:
    upload(blobs, names.blobs, "shared.txt", b"once")
    one, two = make_host(), make_host()
    claims = one.blob_listeners[0].scan()
    assert len(claims) == 1
    assert two.blob_listeners[0].scan() == []  # the receipt is leased by the first
    one.blob_listeners[0].process(claims[0])
    assert two.blob_listeners[0].scan() == []  # and now complete
    assert len(events("on_blob")) == 1


def test_a_failing_blob_is_poisoned_after_five_tries_even_across_a_restart(make_host, names, blobs, queues) -> None:
    etag = upload(blobs, names.blobs, "bad.csv", b"please fail")
    first = make_host()
    assert first.run_once() == 1 and first.run_once() == 1
    assert receipt_metadata(blobs, names, etag, "bad.csv")["Attempts"] == "2"
    second = make_host()
    for _ in range(3):
        assert second.run_once() == 1
    assert second.run_until_idle() == 0
    assert len(events("on_blob", name=f"{names.blobs}/bad.csv")) == 5
    metadata = receipt_metadata(blobs, names, etag, "bad.csv")
    assert metadata["Outcome"] == "poisoned" and metadata["Attempts"] == "5"
    poison = [json.loads(m) for m in drain(queues.get_queue_client(BLOB_POISON_QUEUE))]
    ours = [m for m in poison if m["ContainerName"] == names.blobs]
    assert ours == [{"Type": "BlobTrigger", "FunctionId": "Host.Functions.on_blob", "BlobType": "BlockBlob",
                     "ContainerName": names.blobs, "BlobName": "bad.csv", "ETag": etag}]
    assert [r.outcome for r in second.invocations] == ["failed"] * 3
    assert "this blob asks to fail" in second.invocations[-1].error

def test_tries_that_took_the_host_down_count_toward_poison(make_host, names, blobs, queues) -> None:
    etag = upload(blobs, names.blobs, "crashes-host.bin", b"\x00")
    receipt = f"blobreceipts/{names.host_id}/Host.Functions.on_blob/{etag}/{names.blobs}/crashes-host.bin"
    with contextlib.suppress(ResourceExistsError):
        blobs.get_container_client(HOST_RECEIPTS).create_container()
    blobs.get_blob_client(HOST_RECEIPTS, receipt).upload_blob(b"", metadata={"Attempts": "5"})
    host = make_host(functions=["on_blob"])
    assert host.run_until_idle() == 1
    assert events("on_blob") == [] and host.invocations == []
    assert receipt_metadata(blobs, names, etag, "crashes-host.bin")["Outcome"] == "poisoned"
    poison = [json.loads(m) for m in drain(queues.get_queue_client(BLOB_POISON_QUEUE))]
    assert [m["BlobName"] for m in poison if m["ContainerName"] == names.blobs] == ["crashes-host.bin"]


def test_a_blob_overwritten_before_its_run_is_run_at_its_new_version_only(make_host, names, blobs) -> None:
    old = upload(blobs, names.blobs, "racy.txt", b"old")
    host = make_host(functions=["on_blob"])
    claims = host.blob_listeners[0].scan()
    upload(blobs, names.blobs, "racy.txt", b"new")
    host.blob_listeners[0].process(claims[0])
    assert receipt_metadata(blobs, names, old, "racy.txt")["Outcome"] == "superseded"
    assert host.run_until_idle() == 1
    assert [e["data"] for e in events("on_blob")] == [b"new"]


# --- queue triggers -------------------------------------------------------------------------


def test_failures_retry_with_a_growing_dequeue_count_until_success(make_host, names, blobs, queues) -> None:
    send(queues, names.queue, {"key": "k1", "fail_until": 3})
    host = make_host(functions=["on_message"])
    assert host.run_until_idle() == 3
    calls = events("on_message", key="k1")
    assert [c["dequeue_count"] for c in calls] == [1, 2, 3]
    assert len({c["id"] for c in calls}) == 1 and all(c["pop_receipt"] for c in calls)
    assert calls[0]["inserted"] < calls[0]["expires"]
    assert [r.outcome for r in host.invocations] == ["failed", "failed", "succeeded"]
    result = blobs.get_blob_client(names.results, "k1.json").download_blob().readall()
    assert json.loads(result) == {"key": "k1", "dequeue_count": 3}  # the blob output, path from {key}
    assert drain(queues.get_queue_client(names.queue)) == []


def test_poison_after_max_dequeue_count_moves_the_message_as_is(make_host, names, queues) -> None:
    body = json.dumps({"key": "bad", "always_fail": True})
    send(queues, names.queue, body)
    host = make_host(functions=["on_message"])
    assert host.run_until_idle() == 5
    assert [c["dequeue_count"] for c in events("on_message", key="bad")] == [1, 2, 3, 4, 5]
    assert drain(queues.get_queue_client(names.queue)) == []
    assert drain(queues.get_queue_client(f"{names.queue}-poison")) == [body]


def test_a_message_whose_last_runs_crashed_goes_to_poison_unrun(make_host, names, queues) -> None:
    send(queues, names.queue, {"key": "crashed"})
    client = queues.get_queue_client(names.queue)
    for _ in range(5):  # five receives that never settled, as after five host crashes
        message = next(iter(client.receive_messages(visibility_timeout=30)))
        client.update_message(message, visibility_timeout=0)
    host = make_host(functions=["on_message"])
    assert host.run_until_idle() == 1
    assert events("on_message") == [] and host.invocations == []
    assert [json.loads(m)["key"] for m in drain(queues.get_queue_client(f"{names.queue}-poison"))] == ["crashed"]


def test_base64_and_plain_messages_reach_the_function_alike(make_host, names, queues) -> None:
    send(queues, names.queue, json.dumps({"key": "plain"}))
    send(queues, names.queue, base64.b64encode(json.dumps({"key": "b64"}).encode()).decode())
    host = make_host(functions=["on_message"])
    assert host.run_until_idle() == 2
    assert sorted(e["key"] for e in events("on_message")) == ["b64", "plain"]


def test_batches_run_concurrently_and_refill_at_the_threshold(make_host, names, queues) -> None:
    # batchSize 4, newBatchThreshold 2: when two calls of the first batch finish, the next batch comes
    # while the other two still run, so 6 run at once. The test lets calls finish (QUEUE_VALVE), never a clock.
    for i in range(8):
        send(queues, names.queue, {"key": f"m{i}", "hold": True})
    host = make_host(functions=["on_message"]).start()
    try:
        eventually(lambda: QUEUE_GAUGE.now == 4)  # the first batch runs, and holds
        assert QUEUE_GAUGE.peak == 4 and len(events("on_message")) == 4  # no refill above the threshold
        QUEUE_VALVE.let(2)  # two finish: 2 running is the threshold, so the next batch of 4 comes
        eventually(lambda: QUEUE_GAUGE.now == 6)
        QUEUE_VALVE.open()
        eventually(lambda: len([r for r in host.invocations if r.outcome == "succeeded"]) == 8)
    finally:
        QUEUE_VALVE.open()
        host.stop()
    assert QUEUE_GAUGE.peak == 6
    assert len({e["thread"] for e in events("on_message")}) >= 6
    assert drain(queues.get_queue_client(names.queue)) == []

# --- timer triggers -------------------------------------------------------------------------


def test_a_timer_never_overlaps_itself(make_host, names) -> None:
    host = make_host(functions=["on_timer"])
    TIMER_GATE.clear()
    first = host.fire_timer("on_timer")
    eventually(lambda: events("on_timer"))
    assert host.fire_timer("on_timer") is None  # the first still runs: skipped
    assert host.timers["on_timer"].skipped == 1
    TIMER_GATE.set()
    assert first.result(5).ok
    assert host.fire_timer("on_timer").result(5).ok
    assert TIMER_GAUGE.peak == 1 and len(events("on_timer")) == 2
    assert events("on_timer")[0]["past_due"] is False and "Next" in events("on_timer")[0]["status"]


def test_timer_runs_on_startup_then_on_its_schedule_from_a_setting(make_host, names) -> None:
    names.schedule = "*/1 * * * * *"  # every second, through %T_SCHEDULE%
    host = make_host(functions=["on_timer"]).start()
    eventually(lambda: len(events("on_timer")) >= 3, timeout=6)
    host.stop()
    calls = events("on_timer")
    assert calls[0]["at"] < calls[1]["at"] < calls[2]["at"]
    # Scheduled runs fall on whole seconds (the startup run at any time); loose bounds for a busy machine.
    assert 0.5 < calls[2]["at"] - calls[1]["at"] < 2.5
    assert TIMER_GAUGE.peak == 1


# --- HTTP triggers --------------------------------------------------------------------------


def request(url: str, data: bytes | None = None, method: str = "GET") -> tuple[int, dict, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, method=method), timeout=5) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


@pytest.mark.parametrize(("template", "path", "expected"), [
    ("echo/{item}", "/api/echo/42", {"item": "42"}),
    ("echo/{item}", "/api/echo/a/b", None),
    ("jobs/{id:int}", "/api/jobs/17", {"id": "17"}),
    ("jobs/{id:int}", "/api/jobs/x", None),
    ("items/{id?}", "/api/items", {"id": None}),
    ("items/{id?}", "/api/items/9", {"id": "9"}),
    ("files/{*path}", "/api/files/a/b/c.txt", {"path": "a/b/c.txt"}),
    ("Status", "/api/status/", {}),
])
def test_route_templates(template: str, path: str, expected: dict | None) -> None:
    found = compile_route("api", template).fullmatch(path)
    assert (found.groupdict() if found else None) == expected


def test_http_on_loopback_and_a_raising_route_answers_500(make_host, names) -> None:
    host = make_host(functions=["echo"], port=0).start()
    assert host.http.address[0] == "127.0.0.1"
    status, headers, body = request(f"{host.http_url}/api/echo/42?x=1&y=two")
    assert status == 201 and headers["Content-Type"].startswith("application/json")
    assert json.loads(body) | {"url": ""} == {"item": "42", "params": {"x": "1", "y": "two"}, "method": "GET",
                                               "body": "", "url": ""}
    status, _, body = request(f"{host.http_url}/api/echo/abc", data=b'{"a": 1}', method="POST")
    assert status == 201 and json.loads(body)["body"] == '{"a": 1}'
    assert request(f"{host.http_url}/api/echo/abc?boom=1")[0] == 500
    assert request(f"{host.http_url}/api/echo/abc", method="DELETE")[0] == 404
    assert request(f"{host.http_url}/api/nothing")[0] == 404
    assert request(f"{host.http_url}/api/echo/still-up")[0] == 201
    assert json.loads(request(f"{host.http_url}/admin/host/status")[2]) == {"state": "Running"}
    assert [r.outcome for r in host.invocations] == ["succeeded", "succeeded", "failed", "succeeded"]


# --- robustness and the command line --------------------------------------------------------


def test_raising_functions_do_not_stop_the_host(make_host, names, blobs, queues) -> None:
    names.out = names.queue  # on_blob's queue output feeds on_message: blob -> queue -> blob
    host = make_host(functions=["on_blob", "on_message", "echo"], port=0).start()
    upload(blobs, names.blobs, "bad.txt", b"fail please")
    send(queues, names.queue, {"key": "sour", "always_fail": True})
    upload(blobs, names.blobs, "good.txt", b"fine")
    result = blobs.get_blob_client(names.results, f"{names.blobs}/good.txt.json")
    eventually(result.exists)
    assert json.loads(result.download_blob().readall())["dequeue_count"] == 1
    assert request(f"{host.http_url}/api/echo/ok")[0] == 201
    eventually(lambda: len(events("on_message", key="sour")) == 5)
    eventually(lambda: len(events("on_blob", name=f"{names.blobs}/bad.txt")) == 5)
    assert all(thread.is_alive() for thread in host._threads)
    host.stop()
    failed = [r for r in host.invocations if r.outcome == "failed"]
    assert len(failed) == 10 and {r.function for r in failed} == {"on_blob", "on_message"}


def test_stop_lets_running_invocations_finish_within_the_grace(make_host, names, queues) -> None:
    send(queues, names.queue, {"key": "slow", "hold": True})
    host = make_host(functions=["on_message"]).start()
    eventually(lambda: QUEUE_GAUGE.now == 1)  # the call runs, held
    stopped: list[int] = []
    stopper = threading.Thread(target=lambda: stopped.append(host.stop(grace=30)))
    try:
        stopper.start()
        eventually(lambda: host.stopping.is_set())
        assert host.invocations == [] and QUEUE_GAUGE.now == 1  # stop began while the call still ran
    finally:
        QUEUE_VALVE.open()  # the call finishes inside the grace
        stopper.join(40)
    assert stopped == [0]
    assert [r.outcome for r in host.invocations] == ["succeeded"]
    assert drain(queues.get_queue_client(names.queue)) == []  # finished, so deleted, not left leased
    with pytest.raises(RuntimeError, match="stopped"):
        host.run_once()


def test_the_command_line_runs_an_app_until_sigterm(azurite: Azurite, tmp_path: Path, queues, blobs) -> None:
    tag = uuid.uuid4().hex[:8]
    (tmp_path / "function_app.py").write_text(textwrap.dedent(f"""
        import azure.functions as func
        app = func.FunctionApp()

        @app.queue_trigger(arg_name="msg", queue_name="cli-{tag}", connection="AzureWebJobsStorage")
        @app.blob_output(arg_name="out", path="cli-{tag}/{{id}}.txt", connection="AzureWebJobsStorage")
        def copy(msg: func.QueueMessage, out: func.Out[bytes]) -> None:
            out.set(msg.get_body())
    """))
    (tmp_path / "host.json").write_text(json.dumps(HOST_JSON))
    (tmp_path / "local.settings.json").write_text(json.dumps({"Values": {
        "AzureWebJobsStorage": azurite.connection_string}}))
    env = {k: v for k, v in os.environ.items() if k != "AzureWebJobsStorage"} | {"PYTHONPATH": str(REPO)}
    process = subprocess.Popen([sys.executable, "-m", "upwell.local.devhost", "--script-root", str(tmp_path),
                                "--no-http", "--host-id", f"cli-{tag}"], env=env, cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        send(queues, f"cli-{tag}", "hello from the queue")
        container = blobs.get_container_client(f"cli-{tag}")
        found = eventually(lambda: container.exists() and list(container.list_blobs()), timeout=20)
        assert container.download_blob(found[0].name).readall() == b"hello from the queue"
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=20)
    finally:
        process.kill()
    assert process.returncode == 0, output
    assert '"event": "devhost.invocation"' in output and '"outcome": "succeeded"' in output
    assert '"event": "devhost.stopped"' in output
