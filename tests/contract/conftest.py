"""Contract-test fixtures: a recording HTTP server on 127.0.0.1 that answers the Azure REST
calls the real SDK clients make, and the client settings that point them at it.

Routes are (method, path regex) -> a handler or a list of scripted responses (the
last one repeats). Every request is recorded with its method, path, query, headers
and JSON body, so tests assert the requests' shape. These are contract tests, not
end-to-end tests: nothing here talks to Azure.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from azure.core.credentials import AccessToken
from azure.core.pipeline.policies import SansIOHTTPPolicy


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any

    def q(self, key: str) -> str | None:
        values = self.query.get(key)
        return values[0] if values else None


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[Recorded, re.Match], "Reply | tuple"]


class Recorder:
    """The server's routes and everything it was sent."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self._routes: list[tuple[str, re.Pattern, list[Reply] | Handler]] = []
        self._lock = threading.Lock()
        self.url = ""

    def route(self, method: str, pattern: str, *replies: tuple | Reply | Handler) -> None:
        """Answer METHOD on paths matching ``pattern`` (a regex on the path, anchored):
        one handler, or scripted replies used in turn (the last one repeats). A reply is
        a Reply or a tuple (status, body[, headers])."""
        if len(replies) == 1 and callable(replies[0]):
            target: list[Reply] | Handler = replies[0]
        else:
            target = [r if isinstance(r, Reply) else Reply(*r) for r in replies]
        self._routes.insert(0, (method.upper(), re.compile(pattern + r"/?$", re.I), target))

    def calls(self, method: str, pattern: str = ".*") -> list[Recorded]:
        rx = re.compile(pattern + r"/?$", re.I)
        return [r for r in self.requests if r.method == method.upper() and rx.search(r.path)]

    def answer(self, rec: Recorded) -> Reply:
        with self._lock:
            self.requests.append(rec)
            for method, rx, target in self._routes:
                m = rx.search(rec.path)
                if method == rec.method and m:
                    if callable(target):
                        reply = target(rec, m)
                        return reply if isinstance(reply, Reply) else Reply(*reply)
                    return target.pop(0) if len(target) > 1 else target[0]
        return Reply(404, {"error": {"code": "ResourceNotFound", "message": f"no route for {rec.method} {rec.path}"}})


def _handler_class(recorder: Recorder):
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def _serve(self):
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode("utf-8", "replace")
            rec = Recorded(self.command, parts.path, parse_qs(parts.query), dict(self.headers.items()), body)
            reply = recorder.answer(rec)
            payload = b"" if reply.body is None else json.dumps(reply.body).encode()
            self.send_response(reply.status)
            headers = {"Content-Type": "application/json", **reply.headers}
            for k, v in headers.items():
                self.send_header(k, v.replace("{base}", recorder.url))
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

        do_GET = do_PUT = do_POST = do_PATCH = do_DELETE = do_HEAD = _serve

    return H


@pytest.fixture
def server():
    recorder = Recorder()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_class(recorder))
    httpd.daemon_threads = True
    recorder.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield recorder
    httpd.shutdown()
    httpd.server_close()


class FakeCredential:
    """A TokenCredential that hands out a fixed token and counts how often it was asked."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def get_token(self, *scopes, **kwargs):
        self.calls.append(scopes)
        return AccessToken("fake-token", int(time.time()) + 3600)


class AllowHttp(SansIOHTTPPolicy):
    """Lets the bearer-token policy send to http://127.0.0.1 (it refuses non-TLS URLs by default)."""

    def on_request(self, request):
        request.context["enforce_https"] = False


@pytest.fixture
def credential():
    return FakeCredential()


@pytest.fixture
def client_kwargs(server):
    """SDK client settings for the local server: http allowed, fast retries and polling."""
    return {"base_url": server.url, "per_call_policies": [AllowHttp()], "retry_backoff_factor": 0.01,
            "retry_backoff_max": 0.05, "polling_interval": 0}

