"""The SDK clients read the process's proxy settings once, when they are made (``upwell.storage.sdk_options``).

With no proxy and no CA bundle in the environment, the transport is told not to read it on every request (a
walk of the whole environment, twice a request, in requests). A proxy named in the environment is still used:
a recording HTTP server plays it, and the request reaches it in the absolute form a proxy gets.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from upwell.errors import UpwellError
from upwell.local import azurite
from upwell.storage import Storage, sdk_options

PROXY_AND_CA = ["HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY",
                "no_proxy", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"]


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Answers every request 404 with no body, noting its request line."""

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.lines.append(self.requestline)  # type: ignore[attr-defined]
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.send_header("x-ms-error-code", "BlobNotFound")
        self.end_headers()

    do_GET = do_HEAD = do_PUT = do_POST = _answer

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def recorders() -> Iterator[list[http.server.ThreadingHTTPServer]]:
    servers = []
    for _ in range(2):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
        server.lines = []  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    yield servers
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def bare_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for key in PROXY_AND_CA:
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


def test_the_environment_is_read_per_request_only_where_it_names_a_proxy():
    assert sdk_options({"PATH": "/usr/bin", "HOME": "/root"}) == {"use_env_settings": False}
    for key in [k for k in PROXY_AND_CA if k.lower().endswith("_proxy")] + ["ftp_proxy"]:
        assert sdk_options({"PATH": "/usr/bin", key: "http://127.0.0.1:3128"}) == {}, key
    # a CA bundle is taken once, as requests would take it on each request: REQUESTS_CA_BUNDLE first
    ca = "/etc/ssl/certs/ca-certificates.crt"
    assert sdk_options({"CURL_CA_BUNDLE": ca}) == {"use_env_settings": False, "connection_verify": ca}
    assert sdk_options({"REQUESTS_CA_BUNDLE": ca, "CURL_CA_BUNDLE": "/other.pem"}) == {
        "use_env_settings": False, "connection_verify": ca}
    assert sdk_options({"REQUESTS_CA_BUNDLE": ca, "HTTPS_PROXY": "http://127.0.0.1:3128"}) == {}


def test_a_proxy_in_the_environment_carries_every_request(bare_env, recorders):
    proxy, _ = recorders
    bare_env.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.server_port}")
    bare_env.setenv("NO_PROXY", "169.254.169.254")
    # an account no resolver knows: only a proxy can take the request
    store = Storage(azurite.connection_string(10000, 10001, 10002, host="storage.invalid"))
    assert store.exists("incoming/a.csv") is False
    assert proxy.lines and all(line.split()[1].startswith("http://storage.invalid:10000/devstoreaccount1/")
                               for line in proxy.lines), proxy.lines


def test_without_a_proxy_the_clients_do_not_read_the_environment_again(bare_env, recorders):
    account, proxy = recorders
    store = Storage(azurite.connection_string(account.server_port, account.server_port, account.server_port))
    assert store.options == {"use_env_settings": False}
    # a proxy named once the clients exist is not seen: the request goes straight to the account
    bare_env.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.server_port}")
    assert store.exists("incoming/a.csv") is False
    try:
        store.send("work-cpu", "{}")
    except UpwellError:
        pass  # the recorder answers 404 to the send too; what matters is where it went
    assert proxy.lines == []
    assert [line.split()[1].split("?")[0] for line in account.lines] == [
        "/devstoreaccount1/incoming/a.csv", "/devstoreaccount1/work-cpu/messages"]
