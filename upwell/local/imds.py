"""A stand-in for Azure's Instance Metadata Service (IMDS), for tests: local-only machinery.

Served on 127.0.0.1 on a free port (``ImdsStandIn.url`` is what the agent's ``UPWELL_IMDS_URL`` is set to;
on Azure that setting keeps its default, http://169.254.169.254). The Azure path never imports this module.

What it plays, from Azure's documentation (learn.microsoft.com/azure/virtual-machines/instance-metadata-service
and .../virtual-machines/linux/scheduled-events):
- every request needs the header ``Metadata: true`` and an ``api-version`` query parameter, else 400 with an
  ``error`` text, as IMDS answers;
- ``GET /metadata/instance``: ``compute.name``, ``compute.resourceId``, ``osProfile.computerName``;
- ``GET /metadata/scheduledevents``: ``{"DocumentIncarnation": n, "Events": [...]}``, each event with
  ``EventId``, ``EventType`` (Freeze, Reboot, Redeploy, Preempt, Terminate), ``ResourceType``
  ("VirtualMachine"), ``Resources`` (the affected VMs' names), ``EventStatus`` (Scheduled, then Started once
  approved), ``NotBefore`` (an RFC 1123 time), ``Description``, ``EventSource`` (Platform or User) and
  ``DurationInSeconds`` (-1 when unknown); DocumentIncarnation changes whenever the events change;
- ``POST /metadata/scheduledevents`` with ``{"StartRequests": [{"EventId": ...}]}``: approves those events
  (they become Started), which the stand-in records in ``acks``;
- an event that has happened (the VM is back from its reboot) or that Azure cancelled leaves the document
  (``complete``), and DocumentIncarnation changes;
- Scheduled Events is enabled by the first request for events, whose answer may take up to two minutes
  (``enable_s``: every read of the document waits until that long after the first one);
- requests beyond 5 a second from the VM, whoever sends them, are refused with 429 (``rate_limit``, off unless a
  test asks: the agent's own polling floor is 5 a second).

State: the VM's identity, the scheduled events, the incarnation and the recorded acknowledgements, under
one lock (the server answers on its own threads).
"""

from __future__ import annotations

import json
import threading
import uuid
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from time import sleep, time
from typing import Any
from urllib.parse import parse_qs, urlsplit


class ImdsStandIn:
    """One VM's IMDS. ``schedule`` adds an event; ``acks`` lists the EventIds acknowledged, in order, and
    ``acked_at`` when;
    ``polls`` counts the Scheduled Events reads (a test bounds the agent's polling rate with it)."""

    def __init__(self, vm_name: str, *, resource_id: str = "", computer_name: str = "", enable_s: float = 0.0,
                 rate_limit: int = 0) -> None:
        self.vm_name, self.enable_s, self.rate_limit = vm_name, enable_s, rate_limit
        self.throttled = 0  # requests refused with 429
        self._accepted: list[float] = []  # when the requests of the last second were accepted (rate_limit)
        self.enabled_at: float | None = None  # when the first read of the document asked for it, plus enable_s
        self.resource_id = resource_id or (
            "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/rg/providers/"
            f"Microsoft.Compute/virtualMachines/{vm_name}")
        self.computer_name = computer_name or vm_name
        self.acks: list[str] = []
        self.acked_at: dict[str, float] = {}  # EventId -> when its acknowledgement arrived (epoch seconds)
        self.polls = 0
        self._events: list[dict[str, Any]] = []
        self._incarnation = 1
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.imds = self  # type: ignore[attr-defined]  # what _Handler answers for
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="imds-stand-in")

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> ImdsStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def schedule(self, event_type: str, resources: list[str], *, notice_s: float = 30.0,
                 source: str = "Platform", duration_s: int = -1) -> str:
        """Add a Scheduled event for ``resources`` that starts ``notice_s`` from now; its EventId."""
        event_id = str(uuid.uuid4()).upper()
        event = {"EventId": event_id, "EventType": event_type, "ResourceType": "VirtualMachine",
                 "Resources": list(resources), "EventStatus": "Scheduled",
                 "NotBefore": formatdate(time() + notice_s, usegmt=True), "Description": "",
                 "EventSource": source, "DurationInSeconds": duration_s}
        with self._lock:
            self._events.append(event)
            self._incarnation += 1
        return event_id

    def complete(self, event_id: str) -> None:
        """The event has happened, or was cancelled: it is no longer listed."""
        with self._lock:
            self._events = [e for e in self._events if e["EventId"] != event_id]
            self._incarnation += 1

    def admit(self) -> bool:
        """Whether a request may be answered now: under ``rate_limit`` accepted requests in the last second."""
        if not self.rate_limit:
            return True
        with self._lock:
            now = time()
            self._accepted = [t for t in self._accepted if now - t < 1.0]
            if len(self._accepted) >= self.rate_limit:
                self.throttled += 1
                return False
            self._accepted.append(now)
            return True

    def instance(self) -> dict[str, Any]:
        return {"compute": {"name": self.vm_name, "resourceId": self.resource_id, "osType": "Linux"},
                "osProfile": {"computerName": self.computer_name}}

    def document(self) -> dict[str, Any]:
        with self._lock:
            if self.enabled_at is None:
                self.enabled_at = time() + self.enable_s
            wait = self.enabled_at - time()
        if wait > 0:  # Scheduled Events is being enabled: the answer comes once it is
            sleep(wait)
        with self._lock:
            self.polls += 1
            return {"DocumentIncarnation": self._incarnation, "Events": [dict(e) for e in self._events]}

    def approve(self, body: dict[str, Any]) -> None:
        """The StartRequests POST: each named event is recorded and starts (NotBefore empties, as IMDS shows)."""
        ids = [str(r.get("EventId", "")) for r in body.get("StartRequests") or []]
        with self._lock:
            for event in self._events:
                if event["EventId"] in ids:
                    event.update(EventStatus="Started", NotBefore="")
            self.acks.extend(ids)
            self.acked_at.update({i: time() for i in ids})
            self._incarnation += 1


class _Handler(BaseHTTPRequestHandler):
    """Answers for the stand-in that its server carries (``server.imds``)."""

    def do_GET(self) -> None:
        imds: ImdsStandIn = self.server.imds  # type: ignore[attr-defined]
        path = self._checked()
        if path == "/metadata/instance":
            self._send(200, imds.instance())
        elif path == "/metadata/scheduledevents":
            self._send(200, imds.document())
        elif path is not None:
            self._send(404, {"error": "Not found"})

    def do_POST(self) -> None:
        imds: ImdsStandIn = self.server.imds  # type: ignore[attr-defined]
        path = self._checked()
        if path == "/metadata/scheduledevents":
            length = int(self.headers.get("Content-Length") or 0)
            imds.approve(json.loads(self.rfile.read(length) or b"{}"))
            self._send(200, {})
        elif path is not None:
            self._send(404, {"error": "Not found"})

    def _checked(self) -> str | None:
        """The path, or None once a 400 or a 429 went out: IMDS refuses a request without both headers, and
        one over its rate limit."""
        parts = urlsplit(self.path)
        if not self.server.imds.admit():  # type: ignore[attr-defined]
            self._send(429, {"error": "Too many requests"})
            return None
        if self.headers.get("Metadata", "").lower() != "true":
            self._send(400, {"error": "Bad request. Required metadata header not specified"})
            return None
        if not parse_qs(parts.query).get("api-version"):
            self._send(400, {"error": "Bad request. api-version was not specified in the request."})
            return None
        return parts.path.rstrip("/")

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        try:
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up waiting (a slow first answer)
            pass
