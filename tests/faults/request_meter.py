"""Every storage request this process makes, counted by service, method and who made it.

The Azure SDK clients send through ``requests`` (azure-core's RequestsTransport), so a wrapper around
``requests.adapters.HTTPAdapter.send`` sees every request of every client in the process: ingest, the agent
run in this process, collect, report, the timers, and the devhost's own blob-trigger traffic (the webhook's
send to ``azure-webjobs-blobtrigger-<hostId>``, the listener's receives, property reads and deletes). The
local Event Grid stand-in's requests (its thread ``devhost-eventgrid`` lists containers to find new blobs)
are left out: on Azure the storage account raises those events itself, which is no request of ours.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import requests.adapters

LEFT_OUT = ("devhost-eventgrid",)  # threads whose requests Azure would not make


def service(url: str) -> str:
    """"blob", "queue" or "table", from Azurite's port order or an account host name."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    for kind in ("blob", "queue", "table"):
        if f".{kind}." in host:
            return kind
    path = parts.path
    if "/messages" in path or "azure-webjobs-blobtrigger" in path or "/work-" in path:
        return "queue"
    if "$batch" in path or "Tables" in path or "(PartitionKey" in path or path.rstrip("/").endswith(
            ("jobs", "jobindex", "nodes", "scaling", "janitor")):
        return "table"
    return "blob"


def _shape(path: str) -> str:
    """The path with its account, job and shard ids and message ids left out: one key per kind of request."""
    path = path.split("/", 2)[-1]
    path = re.sub(r"[a-z0-9-]+-[0-9a-f]{12}", "<job>", path)
    path = re.sub(r"s\d{5}", "<shard>", path)
    return re.sub(r"/messages/[0-9a-f-]{36}", "/messages/<id>", path)[:70]


class RequestMeter:
    """While entered, counts requests by ``(service, method)`` (``calls``) and by thread group
    (``by_thread``: the thread's name up to its first digit)."""

    def __init__(self) -> None:
        self.calls: Counter[tuple[str, str]] = Counter()
        self.by_thread: Counter[str] = Counter()
        self.detail: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._quiet = threading.local()
        self._send = requests.adapters.HTTPAdapter.send

    def __enter__(self) -> RequestMeter:
        meter, raw = self, self._send

        def send(adapter, request, *args, **kwargs):
            meter.count(request.method, request.url)
            return raw(adapter, request, *args, **kwargs)

        requests.adapters.HTTPAdapter.send = send
        return self

    def __exit__(self, *exc) -> None:
        requests.adapters.HTTPAdapter.send = self._send

    @contextmanager
    def unmetered(self) -> Iterator[None]:
        """This thread's requests are not counted meanwhile: a test's own watching (what `upwell watch` would
        read), which no part of the pipeline makes."""
        self._quiet.on = True
        try:
            yield
        finally:
            self._quiet.on = False

    def count(self, method: str, url: str) -> None:
        name = threading.current_thread().name
        if name.startswith(LEFT_OUT) or getattr(self._quiet, "on", False):
            return
        group = name.split(" (")[0].rstrip("0123456789_- ")
        with self._lock:
            self.calls[(service(url), method)] += 1
            self.by_thread[group] += 1
            self.detail[f"{group} {method} {_shape(urlsplit(url).path)}"] += 1

    @property
    def total(self) -> int:
        return sum(self.calls.values())

    def per(self, n: int) -> dict[str, float]:
        """Requests per shard by service, and in all."""
        out: Counter[str] = Counter()
        for (kind, _), v in self.calls.items():
            out[kind] += v
        return {**{k: round(v / n, 2) for k, v in sorted(out.items())}, "total": round(self.total / n, 2)}
