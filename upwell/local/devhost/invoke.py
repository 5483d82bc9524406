"""Call one function: build its arguments, run it, write its outputs, log the invocation.

Outputs are written only when the function returns without raising, as on the
Functions host. Every invocation is logged through structlog with the function,
trigger, invocation id, duration and outcome, and kept as an ``InvocationRecord``.
A raising function yields a failed ``Outcome``; it never escapes to the caller.
"""

from __future__ import annotations

import asyncio
import contextvars
import ctypes
import datetime as dt
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import azure.functions as func
from azure.core.exceptions import ResourceNotFoundError
from azure.functions import _abc as func_abc
from azure.functions.blob import InputStream

from upwell import logs
from upwell.local.devhost.app import RETURN, FunctionSpec
from upwell.local.devhost.clients import HostStorage, MessageCodec
from upwell.local.devhost.config import AppSettings

log = logs.get("upwell.local.devhost")
_EXPRESSION = re.compile(r"\{([^{}]+)\}")


@dataclass(frozen=True)
class InvocationRecord:
    invocation_id: str
    function: str
    trigger: str
    outcome: str  # "succeeded" or "failed"
    started: dt.datetime
    duration_s: float
    error: str | None = None


@dataclass(frozen=True)
class Outcome:
    ok: bool
    value: Any = None
    error: BaseException | None = None


def expand(template: str, data: Mapping[str, Any], where: str) -> str:
    """Fill ``{name}`` binding expressions from trigger data (case-insensitive, dotted JSON paths)."""
    lowered = {str(k).lower(): v for k, v in data.items()}

    def one(match: re.Match) -> str:
        key = match[1].strip()
        special = {"rand-guid": lambda: str(uuid.uuid4()), "sys.randguid": lambda: str(uuid.uuid4()),
                   "datetime": lambda: dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H-%M-%SZ"),
                   "sys.utcnow": lambda: dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H-%M-%SZ")}
        if key.lower() in special:
            return special[key.lower()]()
        head, *rest = key.split(".")
        if head.lower() not in lowered:
            raise KeyError(f"{where}: binding expression {{{key}}} has no value in the trigger data")
        value = lowered[head.lower()]
        for part in rest:
            value = value[part]
        return value if isinstance(value, str) else json.dumps(value)
    return _EXPRESSION.sub(one, template)


class Out(func.Out):
    """The value holder passed for each ``func.Out[...]`` parameter."""

    def __init__(self) -> None:
        self._value: Any = None

    def set(self, val: Any) -> None:
        self._value = val

    def get(self) -> Any:
        return self._value


class _Trace(func_abc.TraceContext):
    def __init__(self) -> None:
        self._parent = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"

    trace_state = property(lambda self: "")
    trace_parent = property(lambda self: self._parent)
    attributes = property(lambda self: {})


class _Retry(func_abc.RetryContext):
    retry_count = property(lambda self: 0)
    max_retry_count = property(lambda self: 0)
    exception = property(lambda self: None)


class Context(func.Context):
    """The ``context`` argument: invocation id, function name, trace and retry context."""

    _local = threading.local()

    def __init__(self, invocation_id: str, function_name: str) -> None:
        self._invocation_id, self._function_name = invocation_id, function_name
        self._trace, self._retry = _Trace(), _Retry()

    invocation_id = property(lambda self: self._invocation_id)
    function_name = property(lambda self: self._function_name)
    function_directory = property(lambda self: "")
    thread_local_storage = property(lambda self: self._local)
    trace_context = property(lambda self: self._trace)
    retry_context = property(lambda self: self._retry)


def blob_argument(annotation: Any, data: bytes, **stream: Any) -> Any:
    """A blob as the parameter's type: str, bytes, or ``func.InputStream`` (the default)."""
    if annotation is str:
        return data.decode("utf-8")
    if annotation in (bytes, bytearray):
        return data
    return InputStream(data=data, **stream)


class FunctionTimeoutError(TimeoutError):
    """The invocation ran past host.json ``functionTimeout``; the host cancelled it and counts a failure."""


def _sdk_blob_types() -> tuple[type, ...]:
    """The SDK-type binding classes of azurefunctions-extensions-bindings-blob, when it is installed."""
    try:
        from azurefunctions.extensions.bindings import blob as sdk
    except ImportError:
        return ()
    return (sdk.BlobClient, sdk.ContainerClient, sdk.StorageStreamDownloader)


def sdk_blob_argument(pytype: type, connection: str, connection_string: str, container: str, name: str,
                      client: Any) -> Any:
    """What the Python worker passes for an SDK-type blob parameter: the extension's converter, given the
    same model binding data the host sends (it reads the connection from the environment, as on Azure).
    A connection the environment does not hold (a test's override) gets the equivalent client built here."""
    import os
    from types import SimpleNamespace

    from azurefunctions.extensions.base import Datum
    from azurefunctions.extensions.bindings.blob import BlobClientConverter

    if os.environ.get(connection) == connection_string:
        content = json.dumps({"Connection": connection, "ContainerName": container, "BlobName": name})
        value = SimpleNamespace(version="1.0", source="AzureStorageBlobs", content_type="application/json",
                                content=content)
        return BlobClientConverter.decode(Datum(value, "model_binding_data"), trigger_metadata=None, pytype=pytype)
    kind = pytype.__name__
    if kind == "ContainerClient":
        from azure.storage.blob import ContainerClient

        return ContainerClient.from_connection_string(connection_string, container)
    return client.download_blob() if kind == "StorageStreamDownloader" else client


def blob_trigger_argument(spec: FunctionSpec, client: Any, path: str, props: Any, properties: dict,
                          metadata: dict, connection_string: str = "") -> Any:
    """The trigger argument for a blob: an SDK client (nothing downloaded) or the content as the type asks."""
    annotation = spec.annotations.get(spec.trigger["name"])
    if isinstance(annotation, type) and issubclass(annotation, _sdk_blob_types() or (type(None),)):
        connection = spec.trigger.get("connection") or "AzureWebJobsStorage"
        container, _, name = path.partition("/")
        return sdk_blob_argument(annotation, connection, connection_string, container, name, client)
    content = client.download_blob().readall()
    return blob_argument(annotation, content, name=path, uri=client.url, length=props.size,
                         blob_properties=properties, metadata=metadata)


def _cancel(thread: threading.Thread) -> None:
    """Raise FunctionTimeoutError inside ``thread`` (delivered when it next runs Python code)."""
    if thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(FunctionTimeoutError))


def _messages(value: Any) -> list[str | bytes]:
    if isinstance(value, str | bytes | bytearray):
        return [value]
    if isinstance(value, func_abc.QueueMessage):
        return [value.get_body()]
    if isinstance(value, Iterable) and not isinstance(value, Mapping):
        return [m for item in value for m in _messages(item)]
    raise TypeError(f"a queue output takes str, bytes, QueueMessage or a list of them, not {type(value).__name__}")


def _blob_bytes(value: Any) -> bytes | str:
    if callable(getattr(value, "read", None)):
        value = value.read()
    if isinstance(value, str | bytes | bytearray):
        return bytes(value) if isinstance(value, bytearray) else value
    raise TypeError(f"a blob output takes str, bytes or a readable object, not {type(value).__name__}")


def split_blob_path(path: str, where: str) -> tuple[str, str]:
    container, _, name = path.strip("/").partition("/")
    if not container or not name:
        raise ValueError(f"{where}: blob path {path!r} needs a container and a name")
    return container, name


class Invoker:
    """Runs functions for every listener; keeps no state but the record sink.

    ``storage_for(binding)`` gives the storage of a binding's connection, so that
    outputs go where the binding says.
    """

    def __init__(self, settings: AppSettings, storage_for: Callable[[dict], HostStorage], codec: MessageCodec,
                 record: Callable[[InvocationRecord], None], function_timeout: float | None = None) -> None:
        self.settings = settings
        self.storage_for = storage_for
        self.codec = codec
        self.record = record
        self.function_timeout = function_timeout
        self.on_queue_write: Callable[[str], None] | None = None  # wakes this host's listener of that queue

    def invoke(self, spec: FunctionSpec, trigger_value: Any, data: Mapping[str, Any]) -> Outcome:
        """Run ``spec`` with its trigger argument; write outputs on success; log and record either way."""
        invocation_id = str(uuid.uuid4())
        started, clock = dt.datetime.now(dt.UTC), time.monotonic()
        try:
            kwargs, outs = self._arguments(spec, trigger_value, data, invocation_id)
            value = self._call(spec, kwargs, invocation_id)
            self._write_outputs(spec, outs, value, data)
        except Exception as exc:  # noqa: BLE001 - a function's failure, whatever it raised, is the host's to record
            self._finish(spec, invocation_id, started, time.monotonic() - clock, exc)
            return Outcome(False, error=exc)
        self._finish(spec, invocation_id, started, time.monotonic() - clock, None)
        return Outcome(True, value=value)

    def _call(self, spec: FunctionSpec, kwargs: dict[str, Any], invocation_id: str) -> Any:
        """Run the function; past ``functionTimeout`` it is cancelled and FunctionTimeoutError is raised."""
        def run() -> Any:
            return asyncio.run(spec.func(**kwargs)) if spec.is_async else spec.func(**kwargs)
        if self.function_timeout is None:
            return run()
        box: dict[str, Any] = {}
        context = contextvars.copy_context()

        def target() -> None:
            try:
                box["value"] = context.run(run)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                box["error"] = exc
        thread = threading.Thread(target=target, name=f"devhost-fn-{spec.name}", daemon=True)
        thread.start()
        thread.join(self.function_timeout)
        if thread.is_alive():
            _cancel(thread)
            raise FunctionTimeoutError(f"Timeout value of {self.function_timeout:g} s was exceeded by function "
                                       f"Functions.{spec.name} (Id: {invocation_id}); the invocation was cancelled")
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def _finish(self, spec: FunctionSpec, invocation_id: str, started: dt.datetime, duration: float,
                error: Exception | None) -> None:
        fields = {"function": spec.name, "trigger": spec.trigger_type, "invocation_id": invocation_id,
                  "duration_ms": round(duration * 1000, 1)}
        if error is None:
            # A timer's successful ticks (every few seconds locally) would drown the log: debug level.
            quiet = spec.trigger_type == "timerTrigger"
            (log.debug if quiet else log.info)("devhost.invocation", outcome="succeeded", **fields)
        else:
            log.warning("devhost.invocation", outcome="failed", error=f"{type(error).__name__}: {error}",
                        exc_info=error, **fields)
        self.record(InvocationRecord(invocation_id, spec.name, spec.trigger_type,
                                     "succeeded" if error is None else "failed", started, duration,
                                     None if error is None else f"{type(error).__name__}: {error}"))

    def _arguments(self, spec: FunctionSpec, trigger_value: Any, data: Mapping[str, Any],
                   invocation_id: str) -> tuple[dict[str, Any], dict[str, Out]]:
        kwargs: dict[str, Any] = {spec.trigger["name"]: trigger_value}
        for binding in spec.inputs:
            kwargs[binding["name"]] = self._blob_input(spec, binding, data)
        outs = {b["name"]: Out() for b in spec.outputs if b["name"] != RETURN and b["type"] != "http"}
        kwargs.update(outs)
        if spec.context_param:
            kwargs[spec.context_param] = Context(invocation_id, spec.name)
        return kwargs, outs

    def _path(self, spec: FunctionSpec, binding: dict, key: str, data: Mapping[str, Any]) -> str:
        where = f"function {spec.name}, binding {binding['name']}"
        return expand(self.settings.resolve(binding[key], where), data, where)

    def _blob_input(self, spec: FunctionSpec, binding: dict, data: Mapping[str, Any]) -> Any:
        path = self._path(spec, binding, "path", data)
        container, name = split_blob_path(path, f"function {spec.name}")
        client = self.storage_for(binding).container(container).get_blob_client(name)
        try:
            downloader = client.download_blob()
        except ResourceNotFoundError:
            return None
        props = downloader.properties
        return blob_argument(spec.annotations.get(binding["name"]), downloader.readall(), name=path,
                             uri=client.url, length=props.size, metadata=dict(props.metadata or {}))

    def _write_outputs(self, spec: FunctionSpec, outs: dict[str, Out], value: Any,
                       data: Mapping[str, Any]) -> None:
        for binding in spec.outputs:
            if binding["type"] == "http":
                continue
            result = value if binding["name"] == RETURN else outs[binding["name"]].get()
            if result is None:
                continue
            storage = self.storage_for(binding)
            if binding["type"] == "queue":
                queue = self._path(spec, binding, "queueName", data).lower()
                for message in _messages(result):
                    storage.send(queue, self.codec.encode(message))
                if self.on_queue_write is not None:
                    self.on_queue_write(queue)
            else:
                container, name = split_blob_path(self._path(spec, binding, "path", data), f"function {spec.name}")
                storage.upload(container, name, _blob_bytes(result))
