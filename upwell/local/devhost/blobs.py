"""Blob triggers by polling, with the Functions host's receipts and poison queue.

Each blob version (name + ETag) runs a function once. The proof is a *receipt*
blob in ``azure-webjobs-hosts``, named as the host names it::

    blobreceipts/<hostId>/Host.Functions.<function>/<etag>/<container>/<blob name>

A scan creates the receipt with a conditional create, then takes a 60 s lease on
it (renewed while the function runs); only the lease holder runs the function,
so two devhosts with the same host id never run one version twice at once. The
receipt's metadata says how it went: ``Attempts``, and once finished
``Completed`` (UTC time) and ``Outcome`` (succeeded, poisoned, superseded,
deleted). A receipt with ``Completed`` is never run again, across restarts.

Each try counts an attempt in the receipt *before* the function runs, so a try
that takes the host down counts too. A failure releases the lease; the blob is
retried at a later scan, not before ``visibilityTimeout`` (host.json queues).
After ``maxDequeueCount`` attempts (default 5) a message goes to
``webjobs-blobtrigger-poison`` with the host's fields (Type, FunctionId,
BlobType, ContainerName, BlobName, ETag) and the receipt is completed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceModifiedError, ResourceNotFoundError
from azure.storage.blob import BlobClient, BlobLeaseClient, BlobProperties

from upwell import logs
from upwell.errors import ConfigError
from upwell.local.devhost.app import FunctionSpec
from upwell.local.devhost.clients import HostStorage, MessageCodec, create_container
from upwell.local.devhost.config import QueueSettings
from upwell.local.devhost.invoke import (
    Invoker,
    _sdk_blob_types,
    blob_argument,
    blob_trigger_argument,
    split_blob_path,
)
from upwell.local.devhost.renewer import Renewer
from upwell.names import BLOB_POISON_QUEUE, HOST_RECEIPTS

log = logs.get("upwell.local.devhost")
LEASE_S = 60
_PARAM = re.compile(r"\{([^{}]+)\}")


@dataclass(frozen=True)
class BlobPath:
    """A trigger path such as ``incoming/{name}``; a parameter may span slashes."""

    container: str
    prefix: str
    regex: re.Pattern
    params: tuple[str, ...]

    @classmethod
    def parse(cls, path: str, where: str) -> BlobPath:
        container, pattern = split_blob_path(path, where)
        if "{" in container or "%" in container:
            raise ConfigError(f"{where}: the container of blob path {path!r} must be a plain name")
        parts, params, last = [], [], 0
        for match in _PARAM.finditer(pattern):
            parts.append(re.escape(pattern[last:match.start()]))
            parts.append(f"(?P<p{len(params)}>.+?)")
            params.append(match[1])
            last = match.end()
        parts.append(re.escape(pattern[last:]))
        return cls(container, pattern.split("{", 1)[0], re.compile("".join(parts) + r"\Z", re.S), tuple(params))

    def match(self, name: str) -> dict[str, str] | None:
        found = self.regex.match(name)
        if found is None:
            return None
        return {p: found[f"p{i}"] for i, p in enumerate(self.params)}


@dataclass
class Claim:
    """A blob version this host holds the receipt lease for."""

    name: str
    etag: str
    blob_type: str
    params: dict[str, str]
    receipt: BlobClient
    lease: BlobLeaseClient
    attempts: int
    renewal: int = -1  # the key of its lease in the Renewer

    @property
    def key(self) -> tuple[str, str]:
        return (self.name, self.etag)


def quoted(etag: str) -> str:
    """The ETag as the HTTP header has it; blob listings drop the quotes, properties keep them."""
    return etag if etag.startswith('"') else f'"{etag}"'


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value else None


def blob_properties(props: BlobProperties) -> dict[str, Any]:
    """The ``Properties`` trigger metadata, with the host's key names."""
    return {"ContentLength": props.size, "ContentType": props.content_settings.content_type,
            "ETag": props.etag, "LastModified": _iso(props.last_modified),
            "CreatedOn": _iso(props.creation_time), "BlobType": str(getattr(props.blob_type, "value", props.blob_type))}


class BlobListener:
    """Polls the container of one blob-trigger function and runs each new blob version once.

    State: ``_done`` (versions whose receipt is complete, pruned to what the last
    scan saw), ``_busy`` (versions claimed and not yet finished) and ``_not_before``
    (version -> monotonic time of its next try after a failure).
    """

    def __init__(self, spec: FunctionSpec, path: str, *, source: HostStorage, hosts: HostStorage, invoker: Invoker,
                 queues: QueueSettings, codec: MessageCodec, host_id: str, renewer: Renewer,
                 stopping: threading.Event) -> None:
        self.spec = spec
        self.stopping = stopping
        self.path = BlobPath.parse(path, f"function {spec.name}")
        self.source, self.hosts, self.invoker = source, hosts, invoker
        self.queues, self.codec, self.host_id = queues, codec, host_id
        self.renewer = renewer
        self._done: set[tuple[str, str]] = set()
        self._busy: set[tuple[str, str]] = set()
        self._not_before: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def scan(self) -> list[Claim]:
        """List the container and claim every blob version that is due; the caller runs ``process``."""
        container = self.source.container(self.path.container)
        try:
            blobs = list(container.list_blobs(name_starts_with=self.path.prefix or None))
        except ResourceNotFoundError:
            return []
        claims, seen = [], set()
        for blob in blobs:
            params = self.path.match(blob.name)
            if params is None:
                continue
            blob.etag = quoted(blob.etag)
            key = (blob.name, blob.etag)
            seen.add(key)
            if not self._waiting(key):
                try:
                    claim = self._claim(blob, params)
                except Exception as exc:  # noqa: BLE001 - one blob whose receipt cannot be written
                    # (a name the SDK cannot address) must not stop the rest of the container.
                    log.warning("devhost.blob_claim_failed", function=self.spec.name, blob=blob.name[:200],
                                error=str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
                    with self._lock:
                        self._not_before[key] = time.monotonic() + 30.0
                    continue
                if claim is not None:
                    claims.append(claim)
        with self._lock:
            self._done &= seen
            self._not_before = {k: t for k, t in self._not_before.items() if k in seen}
        return claims

    def _waiting(self, key: tuple[str, str]) -> bool:
        with self._lock:
            return (key in self._done or key in self._busy
                    or self._not_before.get(key, 0.0) > time.monotonic())

    def _receipt(self, name: str, etag: str) -> BlobClient:
        receipt = f"blobreceipts/{self.host_id}/{self.spec.function_id}/{etag}/{self.path.container}/{name}"
        return self.hosts.container(HOST_RECEIPTS).get_blob_client(receipt)

    def _receipt_metadata(self, receipt: BlobClient) -> dict[str, str]:
        """The receipt's metadata, creating the receipt (conditionally) when there is none."""
        try:
            return receipt.get_blob_properties().metadata or {}
        except ResourceNotFoundError:
            pass
        metadata = {"FunctionId": self.spec.function_id, "Attempts": "0"}
        try:
            receipt.upload_blob(b"", overwrite=False, metadata=metadata)
        except ResourceExistsError:  # another host created it meanwhile
            pass
        except ResourceNotFoundError:
            create_container(self.hosts.container(HOST_RECEIPTS))
            with contextlib.suppress(ResourceExistsError):
                receipt.upload_blob(b"", overwrite=False, metadata=metadata)
        return metadata

    def _claim(self, blob: BlobProperties, params: dict[str, str]) -> Claim | None:
        receipt, key = self._receipt(blob.name, blob.etag), (blob.name, blob.etag)
        if not self._receipt_metadata(receipt).get("Completed"):  # one request for a finished receipt
            lease = BlobLeaseClient(receipt)
            try:
                lease.acquire(lease_duration=LEASE_S)
            except HttpResponseError:  # 409: another host holds it
                return None
            metadata = receipt.get_blob_properties().metadata or {}  # again: it may have finished meanwhile
            if not metadata.get("Completed"):
                with self._lock:
                    self._busy.add(key)
                blob_type = str(getattr(blob.blob_type, "value", blob.blob_type))
                # Renewed from the claim on: the claim may wait in the executor before it runs.
                return Claim(blob.name, blob.etag, blob_type, params, receipt, lease,
                             int(metadata.get("Attempts", 0)), self.renewer.add(lease.renew, LEASE_S / 3))
            with contextlib.suppress(HttpResponseError):
                lease.release()
        with self._lock:
            self._done.add(key)
        return None

    def process(self, claim: Claim) -> None:
        """Run the function for one claimed blob and settle its receipt; never raises.

        When the host is stopping, the claim is released unrun, for the next host.
        """
        try:
            if not self.stopping.is_set():
                self._run(claim)
        except Exception as exc:  # noqa: BLE001 - a worker thread never dies: the lease lapses, the blob comes back
            log.warning("devhost.blob_bookkeeping_failed", function=self.spec.name, blob=claim.name,
                        error=f"{type(exc).__name__}: {exc}")
        finally:
            self.renewer.remove(claim.renewal)
            with contextlib.suppress(HttpResponseError):
                claim.lease.release()
            with self._lock:
                self._busy.discard(claim.key)

    def _run(self, claim: Claim) -> None:
        client = self.source.container(self.path.container).get_blob_client(claim.name)
        try:
            downloader = client.download_blob(etag=claim.etag, match_condition=MatchConditions.IfNotModified)
            content = downloader.readall()
        except ResourceModifiedError:  # a newer version exists; the next scan sees its ETag
            return self._complete(claim, "superseded", claim.attempts)
        except ResourceNotFoundError:
            return self._complete(claim, "deleted", claim.attempts)
        if claim.attempts >= self.queues.max_dequeue_count:  # its last tries ended with the host
            self._poison(claim, claim.attempts)
            return self._complete(claim, "poisoned", claim.attempts)
        attempts = claim.attempts + 1
        # Counted before the run, so that a run that takes the host down still counts.
        self._write(claim, {"Attempts": str(attempts)})
        props = downloader.properties
        path = f"{self.path.container}/{claim.name}"
        properties, metadata = blob_properties(props), dict(props.metadata or {})
        annotation = self.spec.annotations.get(self.spec.trigger["name"])
        if isinstance(annotation, type) and issubclass(annotation, _sdk_blob_types() or (type(None),)):
            value = blob_trigger_argument(self.spec, client, path, props, properties, metadata,
                                          self.source.connection_string)
        else:
            value = blob_argument(annotation, content, name=path, uri=client.url, length=props.size,
                                  blob_properties=properties, metadata=metadata)
        data = {**claim.params, "BlobTrigger": path, "Uri": client.url, "Properties": properties,
                "Metadata": metadata}
        if self.invoker.invoke(self.spec, value, data).ok:
            return self._complete(claim, "succeeded", attempts)
        if attempts >= self.queues.max_dequeue_count:
            self._poison(claim, attempts)
            return self._complete(claim, "poisoned", attempts)
        with self._lock:
            self._not_before[claim.key] = time.monotonic() + self.queues.visibility_timeout

    def _write(self, claim: Claim, fields: dict[str, str]) -> None:
        claim.receipt.set_blob_metadata({"FunctionId": self.spec.function_id, **fields}, lease=claim.lease)

    def _poison(self, claim: Claim, attempts: int) -> None:
        message = {"Type": "BlobTrigger", "FunctionId": self.spec.function_id, "BlobType": claim.blob_type,
                   "ContainerName": self.path.container, "BlobName": claim.name, "ETag": claim.etag}
        self.hosts.send(BLOB_POISON_QUEUE, self.codec.encode(json.dumps(message)))
        log.error("devhost.blob_poisoned", function=self.spec.name, blob=f"{self.path.container}/{claim.name}",
                  attempts=attempts, queue=BLOB_POISON_QUEUE)

    def _complete(self, claim: Claim, outcome: str, attempts: int) -> None:
        self._write(claim, {"Attempts": str(attempts), "Outcome": outcome,
                            "Completed": dt.datetime.now(dt.UTC).isoformat()})
        with self._lock:
            self._done.add(claim.key)
            self._not_before.pop(claim.key, None)
        if outcome in ("superseded", "deleted"):
            log.info("devhost.blob_skipped", function=self.spec.name, blob=claim.name, outcome=outcome)
