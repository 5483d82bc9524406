"""Storage adapters: blob, queue and table clients from one connection setting.

Locally the connection is Azurite's development connection string (``upwell.local.azurite``
builds it for the ports a stack runs on) or ``UseDevelopmentStorage=true``. On Azure it
is identity based (``AzureWebJobsStorage__blobServiceUri`` and friends, with
``__credential=managedidentity`` and ``__clientId``); no key is ever read there.
SDK errors are translated here and only here.
"""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.core.pipeline.transport import RequestsTransport
from azure.data.tables import TableServiceClient
from azure.storage.blob import BlobServiceClient, ContentSettings
from azure.storage.queue import QueueServiceClient

from upwell import names
from upwell.errors import ConfigError, Conflict, NotFound, StorageError, TransientError, UpwellError


def sdk_options(environ: Any = None) -> dict[str, Any]:
    """Keyword arguments for every SDK client. With no proxy variable (any ``*_proxy``, in either case) in the
    process's environment, the transport is told not to read the environment on every request (azure-core's
    ``use_env_settings=False``), and a CA bundle it names (``REQUESTS_CA_BUNDLE``, else ``CURL_CA_BUNDLE``, as
    requests would take it) is passed as ``connection_verify`` instead. Otherwise requests walks the whole
    environment twice a request looking for proxies (urllib's ``getproxies_environment``), which grows with the
    environment: with 150 variables, 28% of a queue send's CPU (1.03 against 0.74 ms), with 39, 13%
    (bench/README.md). Where a proxy is set, nothing changes. The environment is read when the clients are
    made: a proxy or bundle set later is not seen."""
    environ = os.environ if environ is None else environ
    if any(k.lower().endswith("_proxy") for k in environ):
        return {}
    bundle = environ.get("REQUESTS_CA_BUNDLE") or environ.get("CURL_CA_BUNDLE")
    return {"use_env_settings": False, **({"connection_verify": bundle} if bundle else {})}


# A download's ranges after its first Get Blob (the SDK's max_chunk_get_size, 4 MiB by default; the first
# request takes up to max_single_get_size, 32 MiB). A reader goes through a big blob range by range, one request
# at a time (the ingest, an agent's staging): each range pays a request's round trip and the service's cost of
# serving it, so fewer, larger ranges read faster, for fewer transactions
# (learn.microsoft.com/azure/storage/blobs/storage-blobs-tune-upload-download-python). Azurite serves a range
# at a cost that barely grows with its size: a 1 GB blob in 16 MiB ranges took 0.75-0.85 CPU s and 0.95-1.2 s
# against 2.4-2.6 CPU s and 2.8-3.0 s in 4 MiB ones, with 7.5-8.7 s in some of its runs (bench/README.md,
# 2026-12-05). The price is memory: a reader holds a chunk or two of this size.
CHUNK_GET_BYTES = 16 << 20


def _credential(env: dict[str, str], prefix: str):
    from azure.identity import DefaultAzureCredential, ManagedIdentityCredential

    client_id = env.get(f"{prefix}__clientId")
    if env.get(f"{prefix}__credential", "").lower() == "managedidentity":
        return ManagedIdentityCredential(client_id=client_id) if client_id else ManagedIdentityCredential()
    return DefaultAzureCredential(managed_identity_client_id=client_id)


def _service_uri(env: dict[str, str], prefix: str, kind: str) -> str | None:
    explicit = env.get(f"{prefix}__{kind}ServiceUri")
    if explicit:
        return explicit
    account = env.get(f"{prefix}__accountName")
    if account:
        return f"https://{account}.{kind}.core.windows.net"
    uri = env.get(f"{prefix}__serviceUri")
    if uri and kind == "blob":
        return uri
    if uri:
        return uri.replace(".blob.", f".{kind}.")
    return None


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, ServiceRequestError | ServiceResponseError | ConnectionError | TimeoutError):
        return True
    if isinstance(exc, HttpResponseError):
        return exc.status_code in (408, 429, 500, 502, 503, 504) or exc.status_code is None
    return False


def _error_code(exc: BaseException) -> str:
    """The service's error code: the SDK's parsed one, else the x-ms-error-code header."""
    code = getattr(exc, "error_code", None) or getattr(getattr(exc, "error", None), "code", None)
    if not code:
        headers = getattr(getattr(exc, "response", None), "headers", None) or {}
        code = headers.get("x-ms-error-code") if hasattr(headers, "get") else None
    return str(code or "")


def storage_error(exc: BaseException, what: str) -> UpwellError:
    """The upwell error for an SDK error, with the service's error code (callers ``raise ... from None``).

    Transient (throttled, 5xx, network) -> TransientError; 404 -> NotFound; 409/412 -> Conflict;
    anything else -> StorageError. An UpwellError is returned as it is."""
    if isinstance(exc, UpwellError):
        return exc
    status = getattr(exc, "status_code", None)
    code = _error_code(exc)
    text = f"{what}: {type(exc).__name__}{f' {code}' if code else ''}: {(str(exc).splitlines() or [''])[0][:300]}"
    if is_transient(exc):
        return TransientError(text, code=code, status=status)
    if isinstance(exc, ResourceNotFoundError) or status == 404:
        return NotFound(text, code=code, status=status)
    if isinstance(exc, ResourceExistsError | ResourceModifiedError) or status in (409, 412):
        return Conflict(text, code=code, status=status)
    return StorageError(text, code=code, status=status)


@contextmanager
def funnel(what: str) -> Iterator[None]:
    """Every SDK error raised inside leaves as an upwell error (``storage_error``), naming ``what``."""
    try:
        yield
    except AzureError as exc:
        raise storage_error(exc, what) from None


class Storage:
    """Clients for one storage account. Keeps the three service clients, and the blob index tags that its
    ``write`` and ``put`` set on every blob (none, or a job's project: ``for_project``)."""

    tags: dict[str, str] = {}

    def __init__(self, connection: str | None = None, env: dict[str, str] | None = None):
        env = dict(os.environ if env is None else env)
        conn = connection if connection is not None else env.get(names.CONNECTION)
        # "UseDevelopmentStorage=true" is passed on as it is: each SDK client resolves it to the emulator's
        # published account on 127.0.0.1:10000-10002 (Azurite's default ports, upwell.local.azurite), so
        # this module needs nothing from upwell/local and the Azure path never loads it.
        self.options = sdk_options()
        blob_options = {**self.options, "max_chunk_get_size": CHUNK_GET_BYTES}
        if conn and conn != "identity":
            self.connection_string: str | None = conn
            self.blobs = BlobServiceClient.from_connection_string(conn, **blob_options)
            self.queues = QueueServiceClient.from_connection_string(conn, **self.options)
            self.tables = TableServiceClient.from_connection_string(conn, **self.options)
            return
        prefix = names.CONNECTION
        blob_uri = _service_uri(env, prefix, "blob")
        if not blob_uri:
            raise ConfigError(f"set {prefix} (a connection string) or {prefix}__blobServiceUri/__serviceUri "
                              f"with __credential=managedidentity")
        cred = _credential(env, prefix)
        self.connection_string = None
        self.blobs = BlobServiceClient(blob_uri, credential=cred, **blob_options)
        self.queues = QueueServiceClient(_service_uri(env, prefix, "queue"), credential=cred, **self.options)
        self.tables = TableServiceClient(endpoint=_service_uri(env, prefix, "table"), credential=cred,
                                         **self.options)

    def for_project(self, project: str) -> Storage:
        """The same clients, writing every blob with the index tag project=<project> (upwell.access.tags):
        what upwell writes for a job carries its project, which the viewers' role conditions test."""
        from upwell.access.tags import project_tags

        view = copy.copy(self)
        view.tags = project_tags(project)
        return view

    # -- setup ---------------------------------------------------------------
    def ensure(self) -> None:
        """Create every container, queue and table upwell uses (idempotent)."""
        for name in names.CONTAINERS:
            _create_quietly(self.blobs.create_container, name)
        for name in names.ALL_QUEUES:
            _create_quietly(self.queues.create_queue, name)
        for name in names.TABLES:
            _create_quietly(self.tables.create_table, name)

    # -- clients -------------------------------------------------------------
    def container(self, name: str):
        return self.blobs.get_container_client(name)

    def blob(self, container: str, name: str):
        """The client of one blob. A name with '.' or '..' segments (stored as is when an upload sent them
        percent-encoded) keeps them encoded on the wire: the HTTP stack would resolve them and address
        another blob (or fail the signature)."""
        if not dot_segments(name):
            return self.blobs.get_blob_client(container, name)
        from azure.storage.blob import BlobClient

        return BlobClient(self.blobs.url, container, name, credential=self.blobs.credential,
                          max_chunk_get_size=CHUNK_GET_BYTES, transport=DotSegments(**self.options))

    @functools.lru_cache(maxsize=64)  # noqa: B019 - a handful of queues per process
    def queue(self, name: str):
        return self.queues.get_queue_client(name)

    @functools.lru_cache(maxsize=8)  # noqa: B019
    def table(self, name: str):
        return self.tables.get_table_client(name)

    # -- blob helpers ----------------------------------------------------------
    def read(self, path: str) -> bytes:
        container, name = split_path(path)
        try:
            return self.blob(container, name).download_blob().readall()
        except AzureError as exc:
            raise storage_error(exc, f"read {path}") from None

    def write(self, path: str, data: bytes | Any, *, overwrite: bool = True, content_type: str | None = None,
              metadata: dict[str, str] | None = None) -> bool:
        """Upload; with overwrite=False it is a conditional create and returns False if it existed."""
        container, name = split_path(path)
        kwargs: dict[str, Any] = {"metadata": metadata}
        if self.tags:
            kwargs["tags"] = self.tags
        if content_type:
            kwargs["content_settings"] = ContentSettings(content_type=content_type)
        try:
            if overwrite:
                self.blob(container, name).upload_blob(data, overwrite=True, **kwargs)
            else:
                # IfMissing without an etag: passing etag="*" too raises a TypeError in the SDK.
                self.blob(container, name).upload_blob(data, match_condition=MatchConditions.IfMissing, **kwargs)
            return True
        except ResourceExistsError:
            return False
        except HttpResponseError as exc:
            if exc.status_code in (409, 412):
                return False
            raise storage_error(exc, f"write {path}") from None
        except AzureError as exc:
            raise storage_error(exc, f"write {path}") from None

    def put(self, path: str, data: bytes | Any, *, metadata: dict[str, str] | None = None) -> str:
        """Upload, replacing any blob of that name; returns the new blob's ETag."""
        container, name = split_path(path)
        try:
            return str(self.blob(container, name).upload_blob(data, overwrite=True, metadata=metadata,
                                                              **({"tags": self.tags} if self.tags else {}))["etag"])
        except AzureError as exc:
            raise storage_error(exc, f"write {path}") from None

    def properties(self, path: str) -> Any:
        """The blob's properties (etag, size, last_modified, metadata); NotFound when it is gone."""
        container, name = split_path(path)
        try:
            return self.blob(container, name).get_blob_properties()
        except AzureError as exc:
            raise storage_error(exc, f"properties of {path}") from None

    def chunks(self, path: str, *, etag: str | None = None, offset: int | None = None, length: int | None = None,
               version_id: str | None = None) -> BlobChunks:
        """The blob's content, chunk by chunk as the caller iterates; with ``etag``, only that version
        (Conflict when it changed); with ``offset`` and ``length``, only that range (one ranged Get Blob);
        with ``version_id``, that version of a versioned account (immutable: no condition needed). A missing
        blob raises NotFound here, before the first chunk. The chunks carry the version they read (``etag``,
        ``version_id``): the SDK asks for every chunk after the first on that ETag."""
        container, name = split_path(path)
        condition: dict[str, Any] = {"etag": etag, "match_condition": MatchConditions.IfNotModified} if etag else {}
        if version_id:
            condition = {"version_id": version_id}
        try:
            downloader = self.blob(container, name).download_blob(offset, length, **condition)
        except AzureError as exc:
            raise storage_error(exc, f"read {path}") from None
        return BlobChunks(downloader, f"read {path}")

    def delete(self, path: str, *, etag: str | None = None) -> None:
        """Delete a blob and its snapshots; with ``etag``, only that version (Conflict when it changed,
        NotFound when gone)."""
        container, name = split_path(path)
        condition: dict[str, Any] = {"etag": etag, "match_condition": MatchConditions.IfNotModified} if etag else {}
        try:
            self.blob(container, name).delete_blob(delete_snapshots="include", **condition)
        except AzureError as exc:
            raise storage_error(exc, f"delete {path}") from None

    def download(self, path: str, fh: Any) -> None:
        """Stream a blob into an open binary file."""
        container, name = split_path(path)
        try:
            self.blob(container, name).download_blob().readinto(fh)
        except AzureError as exc:
            raise storage_error(exc, f"download {path}") from None

    # -- queue helpers -----------------------------------------------------------
    def send(self, queue: str, text: str) -> None:
        try:
            self.queue(queue).send_message(text)
        except AzureError as exc:
            raise storage_error(exc, f"send to {queue}") from None

    def receive(self, queue: str, *, visibility_timeout: int) -> Any | None:
        """One message leased for ``visibility_timeout`` s, or None when the queue is empty."""
        try:
            return self.queue(queue).receive_message(visibility_timeout=visibility_timeout)
        except AzureError as exc:
            raise storage_error(exc, f"receive from {queue}") from None

    def receive_many(self, queue: str, *, visibility_timeout: int, max_messages: int = 32) -> list[Any]:
        """Up to ``max_messages`` messages (at most 32, the service's limit) in one call, each leased for
        ``visibility_timeout`` s from now; [] when the queue is empty."""
        n = max(1, min(int(max_messages), 32))
        try:
            return list(self.queue(queue).receive_messages(messages_per_page=n, max_messages=n,
                                                           visibility_timeout=visibility_timeout))
        except AzureError as exc:
            raise storage_error(exc, f"receive from {queue}") from None

    def queue_length(self, queue: str) -> int:
        """The approximate number of messages (visible and leased); 0 for a queue that does not exist."""
        try:
            return self.queue(queue).get_queue_properties().approximate_message_count or 0
        except ResourceNotFoundError:
            return 0
        except AzureError as exc:
            raise storage_error(exc, f"count {queue}") from None

    def exists(self, path: str) -> bool:
        container, name = split_path(path)
        try:
            return self.blob(container, name).exists()
        except AzureError as exc:
            raise storage_error(exc, f"exists {path}") from None

    def list(self, container: str, prefix: str | None = None, *, metadata: bool = False) -> Iterator[Any]:
        """The blobs under ``prefix``, listed page by page as the caller iterates; with ``metadata``, each with
        its metadata (List Blobs ``include=metadata``)."""
        try:
            yield from self.container(container).list_blobs(name_starts_with=prefix,
                                                            include=["metadata"] if metadata else None)
        except AzureError as exc:
            raise storage_error(exc, f"list {container}/{prefix or ''}") from None


class BlobChunks:
    """A download's chunks as the caller iterates, SDK errors funnelled into upwell errors; ``etag`` and
    ``version_id``: the version the first response came from, which every later chunk request is
    conditioned on (azure-storage-blob ``_download.py`` sets If-Match to it)."""

    def __init__(self, downloader: Any, what: str):
        props = downloader.properties
        self.etag: str = str(props.etag or "")
        self.version_id: str = str(getattr(props, "version_id", None) or "")
        self._chunks, self._what = downloader.chunks(), what

    def __iter__(self) -> Iterator[bytes]:
        return _funnelled(self._chunks, self._what)


def _funnelled(chunks: Iterator[bytes], what: str) -> Iterator[bytes]:
    try:
        yield from chunks
    except AzureError as exc:
        raise storage_error(exc, what) from None


def dot_segments(name: str) -> bool:
    """Whether a blob name has '.' or '..' path segments."""
    return any(part in (".", "..") for part in name.split("/"))


def _encode_dot_segments(url: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    path = "/".join({"..": "%2E%2E", ".": "%2E"}.get(seg, seg) for seg in parts.path.split("/"))
    return urlunsplit(parts._replace(path=path))


class DotSegments(RequestsTransport):
    """Sends '.' and '..' path segments percent-encoded. It acts after the request is signed, so a
    SharedKey signature covers the name as stored and the HTTP stack cannot resolve the segments."""

    def send(self, request, **kwargs):
        request.url = _encode_dot_segments(request.url)
        return super().send(request, **kwargs)


def split_path(path: str) -> tuple[str, str]:
    """'container/name/with/slashes' -> ('container', 'name/with/slashes')."""
    container, _, name = path.lstrip("/").partition("/")
    if not container or not name:
        raise ValueError(f"blob path {path!r} must be <container>/<name>")
    return container, name


def _create_quietly(create, name: str) -> None:
    try:
        create(name)
    except ResourceExistsError:
        pass
    except AzureError as exc:
        if getattr(exc, "status_code", None) != 409:
            raise storage_error(exc, f"create {name}") from None
