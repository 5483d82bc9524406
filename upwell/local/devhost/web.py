"""HTTP triggers served on 127.0.0.1 at ``/<routePrefix>/<route>`` (``/api`` by default).

Route templates follow the host's: ``jobs/{id}``, a constraint ``{id:int}``,
an optional ``{id?}`` and a catch-all ``{*rest}``; a function without a route
is served at its name. Auth levels are not enforced, as with ``func start``.
A test principal in ``X-MS-CLIENT-PRINCIPAL`` (base64 JSON, App Service's format) is checked and passed on
with the ``-NAME``, ``-ID`` and ``-IDP`` headers App Service derives from it (``with_principal``); a
malformed one answers 401, as no request would reach a function on Azure with one.
The function gets a ``func.HttpRequest``; its ``func.HttpResponse`` (or str)
goes back. A function that raises answers 500 and the server goes on.
``/admin/host/status`` answers ``{"state": "Running"}``, as the host does, and
``/runtime/webhooks/blobs`` is the blobs extension webhook (``webhook.BlobWebhook``) and
``/runtime/webhooks/eventgrid`` the Event Grid extension's (``eventgrid.EventGridWebhook``).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol
from urllib.parse import parse_qsl, urlsplit

import azure.functions as func

from upwell import logs
from upwell.access import principal
from upwell.errors import PrincipalInvalid
from upwell.local.devhost.app import FunctionSpec
from upwell.local.devhost.invoke import Invoker

log = logs.get("upwell.local.devhost")
LOOPBACK = "127.0.0.1"
_PARAM = re.compile(r"\{(\*?)([A-Za-z_][A-Za-z0-9_]*)(?::([a-z]+))?(\?)?\}")
_CONSTRAINTS = {"int": r"-?\d+", "long": r"-?\d+", "bool": r"(?i:true|false)", "guid": r"[0-9A-Fa-f-]{32,36}",
                "alpha": r"[A-Za-z]+", "double": r"-?\d+(?:\.\d+)?", "float": r"-?\d+(?:\.\d+)?"}


class Webhook(Protocol):
    """An extension's webhook: ``(status, headers, body)`` for one request."""

    def handle(self, method: str, target: str, headers: dict[str, str], body: bytes) -> tuple[int, dict, bytes]: ...


@dataclass(frozen=True)
class Route:
    spec: FunctionSpec
    regex: re.Pattern
    methods: frozenset[str]  # empty: any method


def compile_route(prefix: str, template: str) -> re.Pattern:
    """A regex for ``/<prefix>/<template>``; the named groups are the route parameters."""
    template = template.strip("/")
    pattern, last = "", 0
    for match in _PARAM.finditer(template):
        literal = template[last:match.start()]
        catch_all, name, constraint, optional = match.groups()
        body = ".*" if catch_all else _CONSTRAINTS.get(constraint or "", "[^/]+")
        if optional and literal.endswith("/"):
            pattern += re.escape(literal[:-1]) + f"(?:/(?P<{name}>{body}))?"
        else:
            pattern += re.escape(literal) + f"(?P<{name}>{body})" + ("?" if optional or catch_all else "")
        last = match.end()
    pattern += re.escape(template[last:])
    base = f"/{prefix}/" if prefix else "/"
    return re.compile(re.escape(base) + pattern + "/?", re.IGNORECASE)


def make_route(spec: FunctionSpec, prefix: str) -> Route:
    template = spec.trigger.get("route") or spec.name
    methods = frozenset(m.upper() for m in spec.trigger.get("methods") or ())
    return Route(spec, compile_route(prefix, template), methods)


OID_TYPES = ("http://schemas.microsoft.com/identity/claims/objectidentifier", "oid")


def with_principal(headers: dict[str, str]) -> dict[str, str]:
    """The request's headers as App Service's authentication passes them on: a principal header is decoded
    (PrincipalInvalid when malformed) and the caller's name, object id and identity provider are added as
    ``X-MS-CLIENT-PRINCIPAL-NAME``, ``-ID`` and ``-IDP``; without one, those are removed (only the platform
    sets them). Followed: "Work with user identities in Azure App Service authentication"."""
    derived = (principal.HEADER + "-name", principal.HEADER + "-id", principal.HEADER + "-idp")
    out = {k: v for k, v in headers.items() if k.lower() not in derived}
    value = next((v for k, v in headers.items() if k.lower() == principal.HEADER), None)
    if value is None:
        return out
    doc = principal.decode(value)
    claims = {c["typ"]: c["val"] for c in doc["claims"]}
    name = principal.of_user(doc, {}).name
    oid = next((claims[t] for t in OID_TYPES if t in claims), "")
    return {**out, "X-MS-CLIENT-PRINCIPAL-NAME": name, "X-MS-CLIENT-PRINCIPAL-ID": oid,
            "X-MS-CLIENT-PRINCIPAL-IDP": str(doc.get("auth_typ") or "")}


def _response(result: object) -> tuple[int, dict[str, str], bytes]:
    if isinstance(result, func.HttpResponse):
        headers = dict(result.headers)
        if not any(k.lower() == "content-type" for k in headers):
            headers["Content-Type"] = f"{result.mimetype}; charset={result.charset}"
        return result.status_code, headers, result.get_body()
    if result is None:
        return 204, {}, b""
    if isinstance(result, bytes | str):
        body = result.encode() if isinstance(result, str) else result
        return 200, {"Content-Type": "text/plain; charset=utf-8"}, body
    raise TypeError(f"an HTTP function returns func.HttpResponse or str, not {type(result).__name__}")


class HttpServer:
    """A threading HTTP server on the loopback interface that dispatches to HTTP-trigger functions."""

    def __init__(self, specs: list[FunctionSpec], invoker: Invoker, *, port: int = 7071, prefix: str = "api",
                 webhooks: Mapping[str, Webhook] | None = None) -> None:
        self.routes = [make_route(spec, prefix) for spec in specs]
        self.invoker = invoker
        self.webhooks = {path.lower(): hook for path, hook in (webhooks or {}).items()}
        self.server = ThreadingHTTPServer((LOOPBACK, port), _handler(self))
        self.server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        return self.server.server_address[:2]

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self.server.serve_forever, name="devhost-http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self.server.shutdown()
            self._thread.join(5)
        self.server.server_close()

    def match(self, method: str, path: str) -> tuple[Route, dict[str, str]] | None:
        for route in self.routes:
            found = route.regex.fullmatch(path)
            if found and (not route.methods or method in route.methods):
                return route, {k: v for k, v in found.groupdict().items() if v is not None}
        return None

    def dispatch(self, method: str, target: str, headers: dict[str, str], body: bytes) -> tuple[int, dict, bytes]:
        parts = urlsplit(target)
        if parts.path.rstrip("/") == "/admin/host/status":
            return 200, {"Content-Type": "application/json"}, json.dumps({"state": "Running"}).encode()
        hook = self.webhooks.get(parts.path.rstrip("/").lower())  # the host's routes ignore case
        if hook is not None:
            return hook.handle(method, target, headers, body)
        found = self.match(method, parts.path)
        if found is None:
            return 404, {}, b""
        route, route_params = found
        try:
            headers = with_principal(headers)
        except PrincipalInvalid as exc:
            return 401, {"Content-Type": "text/plain; charset=utf-8"}, str(exc).encode()
        request = func.HttpRequest(method, f"{self.url}{target}", headers=headers,
                                   params=dict(parse_qsl(parts.query, keep_blank_values=True)),
                                   route_params=route_params, body=body)
        outcome = self.invoker.invoke(route.spec, request, {**route_params, **request.params})
        if not outcome.ok:
            return 500, {}, b""
        try:
            return _response(outcome.value)
        except TypeError as exc:
            log.warning("devhost.http_response_invalid", function=route.spec.name, error=str(exc))
            return 500, {}, b""


def _handler(server: HttpServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            status, headers, payload = server.dispatch(self.command, self.path, dict(self.headers.items()), body)
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _serve

        def log_message(self, format: str, *args: object) -> None:  # the invocation log says enough
            pass

    return Handler
