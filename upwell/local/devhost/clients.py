"""Storage clients per connection, and the queue message encoding the host applies.

Queue clients are built without an SDK encode/decode policy, so the devhost
sees and writes the raw message text and applies ``MessageCodec`` itself:

* **Out** (output bindings, blob poison messages): with host.json
  ``extensions.queues.messageEncoding`` "base64" (the host's default) the
  base64 of the UTF-8 bytes; with "none" (what upwell's host.json chooses, so
  that a 64 KiB JSON work item fits and SDK senders and the agent agree) the
  text itself. Exactly as the host writes.
* **In** (trigger), whatever the setting: text that is strict base64 *and*
  decodes to UTF-8 is decoded; any other text is passed as its UTF-8 bytes.
  The real host is strict (with "base64" it fails plain text, with "none" it
  passes base64 undecoded); the devhost accepts both so that Storage Explorer
  (which base64-encodes by default) and plain-JSON scripts both work locally.
  JSON is never mistaken for base64: ``{``, ``[`` and ``"`` are not in its alphabet.
"""

from __future__ import annotations

import base64
import binascii
import threading

from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError
from azure.storage.blob import BlobServiceClient, ContainerClient
from azure.storage.queue import QueueClient, QueueServiceClient

from upwell.storage import sdk_options


class MessageCodec:
    """Encode and decode queue message text for one ``messageEncoding`` ("base64" or "none")."""

    def __init__(self, encoding: str = "base64") -> None:
        self.encoding = encoding

    def decode(self, text: str) -> bytes:
        raw = text.encode("utf-8")
        if not text:
            return raw
        try:
            decoded = base64.b64decode(text, validate=True)
            decoded.decode("utf-8")
        except (binascii.Error, ValueError):
            return raw
        return decoded

    def encode(self, body: str | bytes) -> str:
        data = body.encode("utf-8") if isinstance(body, str) else bytes(body)
        if self.encoding == "base64":
            return base64.b64encode(data).decode("ascii")
        return data.decode("utf-8")


class HostStorage:
    """The blob and queue clients of one connection string; clients are cached per name."""

    def __init__(self, connection_string: str) -> None:
        self.connection_string = connection_string
        options = sdk_options()
        self.blobs = BlobServiceClient.from_connection_string(connection_string, **options)
        self.queues = QueueServiceClient.from_connection_string(connection_string, **options)
        self._containers: dict[str, ContainerClient] = {}
        self._queue_clients: dict[str, QueueClient] = {}
        self._lock = threading.Lock()

    def container(self, name: str) -> ContainerClient:
        with self._lock:
            if name not in self._containers:
                self._containers[name] = self.blobs.get_container_client(name)
            return self._containers[name]

    def queue(self, name: str) -> QueueClient:
        with self._lock:
            if name not in self._queue_clients:
                self._queue_clients[name] = self.queues.get_queue_client(name)
            return self._queue_clients[name]

    def send(self, queue: str, text: str) -> None:
        """Send raw ``text`` to ``queue``, creating the queue if it does not exist (as the host does)."""
        client = self.queue(queue)
        try:
            client.send_message(text)
        except ResourceNotFoundError:
            create_queue(client)
            client.send_message(text)

    def upload(self, container: str, name: str, data: bytes | str) -> None:
        """Write a blob, creating the container if it does not exist."""
        client = self.container(container)
        try:
            client.upload_blob(name, data, overwrite=True)
        except ResourceNotFoundError:
            create_container(client)
            client.upload_blob(name, data, overwrite=True)


def create_queue(client: QueueClient) -> None:
    try:
        client.create_queue()
    except ResourceExistsError:
        pass


def create_container(client: ContainerClient) -> None:
    try:
        client.create_container()
    except ResourceExistsError:
        pass


class Connections:
    """One ``HostStorage`` per connection string, shared by every function that names it."""

    def __init__(self) -> None:
        self._by_string: dict[str, HostStorage] = {}
        self._lock = threading.Lock()

    def get(self, connection_string: str) -> HostStorage:
        with self._lock:
            if connection_string not in self._by_string:
                self._by_string[connection_string] = HostStorage(connection_string)
            return self._by_string[connection_string]
