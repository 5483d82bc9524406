"""The blobs extension webhook: ``POST /runtime/webhooks/blobs?functionName=Host.Functions.<fn>&code=<key>``.

What the Storage extension does with an Event Grid delivery (azure-sdk-for-net,
``BlobsExtensionConfigProvider.ProcessEventsAsync``): for each event of the
array, a ``BlobTriggerMessage`` (``Type``, ``FunctionId`` from the query,
``BlobType``, ``ContainerName``, ``BlobName`` from ``data.url``, ``ETag`` quoted)
goes on the host queue ``azure-webjobs-blobtrigger-<hostId>``, and the answer
is 202. The host checks the ``code`` against its ``blobs_extension`` system key
first (401 otherwise). A subscription's validation handshake
(``aeg-event-type: SubscriptionValidation``) is answered with the code.

The system key lives where the host keeps its secrets: the blob
``azure-webjobs-secrets/<hostId>/host.json`` (``systemKeys``). It is created on
first use; the local event publisher reads it there, as the Bicep reads it with
``listKeys`` on Azure.
"""

from __future__ import annotations

import hmac
import json
import secrets
from collections.abc import Callable
from urllib.parse import parse_qsl, unquote, urlsplit

import structlog
from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError

from upwell.local.devhost.clients import HostStorage, MessageCodec, create_container
from upwell.names import HOST_SECRETS, blob_trigger_queue

log = structlog.get_logger("upwell.local.devhost")
PATH = "/runtime/webhooks/blobs"
SYSTEM_KEY = "blobs_extension"


def system_key(hosts: HostStorage, host_id: str, name: str = SYSTEM_KEY) -> str:
    """The host's system key ``name``, created (conditionally) in its secrets blob when missing."""
    blob = hosts.container(HOST_SECRETS).get_blob_client(f"{host_id}/host.json")
    for _ in range(3):
        try:
            doc = json.loads(blob.download_blob().readall())
        except ResourceNotFoundError:
            doc = None
        if doc is not None:
            for key in doc.get("systemKeys", []):
                if key.get("name") == name:
                    return key["value"]
        new = dict(doc or {"masterKey": {"name": "master", "value": secrets.token_urlsafe(40), "encrypted": False},
                           "functionKeys": [], "systemKeys": []})
        new["systemKeys"] = [*new.get("systemKeys", []),
                             {"name": name, "value": secrets.token_urlsafe(40), "encrypted": False}]
        try:
            if doc is None:
                try:
                    blob.upload_blob(json.dumps(new), overwrite=False)
                except ResourceNotFoundError:
                    create_container(hosts.container(HOST_SECRETS))
                    blob.upload_blob(json.dumps(new), overwrite=False)
            else:
                blob.upload_blob(json.dumps(new), overwrite=True)
        except ResourceExistsError:  # another host wrote it meanwhile: read it again
            continue
    return system_key(hosts, host_id, name) if doc is None else next(
        k["value"] for k in new["systemKeys"] if k["name"] == name)


class KeyedWebhook:
    """A webhook the host guards with one of its system keys (``key_name``), as it guards every
    ``/runtime/webhooks/<extension>`` path before the extension sees the request. State: the key, once read."""

    key_name = SYSTEM_KEY

    def __init__(self, hosts: HostStorage, host_id: str) -> None:
        self.hosts, self.host_id = hosts, host_id
        self._key: str | None = None

    @property
    def key(self) -> str:
        if self._key is None:
            self._key = system_key(self.hosts, self.host_id, self.key_name)
        return self._key

    def admit(self, method: str, target: str, headers: dict[str, str]) -> tuple[dict, dict] | int:
        """The query parameters and lower-cased headers of a POST whose ``code`` (or ``x-functions-key``) is
        the key; else the status the host answers: 401 for another key, 405 for another method."""
        params = dict(parse_qsl(urlsplit(target).query, keep_blank_values=True))
        lower = {k.lower(): v for k, v in headers.items()}
        code = params.get("code") or lower.get("x-functions-key", "")
        if not hmac.compare_digest(code.encode(), self.key.encode()):
            return 401
        return (params, lower) if method == "POST" else 405


def blob_trigger_message(event: dict, function_id: str) -> dict:
    """The extension's BlobTriggerMessage for one Event Grid BlobCreated event."""
    data = event["data"]
    url = urlsplit(data["url"])
    parts = unquote(url.path).lstrip("/").split("/")
    # IP-style URLs (Azurite: http://127.0.0.1:10000/devstoreaccount1/<container>/<blob>) carry the
    # account as the first segment; BlobUriBuilder reads them the same way.
    if _ip_style(url.hostname or ""):
        parts = parts[1:]
    container, blob_name = parts[0], "/".join(parts[1:])
    blob_type = str(data.get("blobType", "BlockBlob")).replace("Blob", "")
    return {"Type": "BlobTrigger", "FunctionId": function_id, "BlobType": blob_type,
            "ContainerName": container, "BlobName": blob_name, "ETag": f'"{str(data["eTag"]).strip(chr(34))}"'}


def _ip_style(host: str) -> bool:
    return host == "localhost" or host.replace(".", "").isdigit() or ":" in host


class BlobWebhook(KeyedWebhook):
    """Answers Event Grid deliveries for this host's blob triggers (the ``blobs_extension`` key)."""

    def __init__(self, hosts: HostStorage, host_id: str, codec: MessageCodec,
                 on_enqueue: Callable[[], None] | None = None) -> None:
        super().__init__(hosts, host_id)
        self.codec = codec
        self.queue = blob_trigger_queue(host_id)
        self.on_enqueue = on_enqueue

    def handle(self, method: str, target: str, headers: dict[str, str], body: bytes) -> tuple[int, dict, bytes]:
        seen = self.admit(method, target, headers)
        if isinstance(seen, int):
            return seen, {}, b""
        params, lower = seen
        try:
            events = json.loads(body or b"[]")
        except ValueError:
            return 400, {}, b""
        events = events if isinstance(events, list) else [events]
        if lower.get("aeg-event-type") == "SubscriptionValidation":
            code = events[0]["data"]["validationCode"] if events else ""
            return 200, {"Content-Type": "application/json"}, json.dumps({"validationResponse": code}).encode()
        function_id = params.get("functionName", "")
        try:
            messages = [blob_trigger_message(e, function_id) for e in events]
        except (KeyError, TypeError, IndexError):
            return 400, {}, b""
        for message in messages:
            self.hosts.send(self.queue, self.codec.encode(json.dumps(message)))
        if messages and self.on_enqueue is not None:
            self.on_enqueue()
        return 202, {}, b""
