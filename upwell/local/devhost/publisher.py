"""A local stand-in for the Event Grid system topic on the storage account.

Azurite raises no events, so the publisher watches the containers that the
subscriptions filter on and turns each new blob version into an Event Grid-schema
``Microsoft.Storage.BlobCreated`` event, then delivers it as Event Grid does:

* one subscription per ``source=EventGrid`` blob trigger, with the subject filter,
  retry policy and dead-letter container of ``bicep/modules/events.bicep``;
* created with the validation handshake; blobs written before a subscription
  existed get no event (as on Azure: the reconciler finds them);
* POSTed to the blobs extension webhook with the ``blobs_extension`` key (a blob
  trigger's subscription), or to the Event Grid extension webhook with the
  ``eventgrid_extension`` key (an Event Grid trigger's: the function runs inside the
  delivery), one event per request (``maxEventsPerBatch: 1``); 200-204 is delivered; 400, 401,
  403 and 413 are dead-lettered at once; anything else (or no answer) is retried
  on Event Grid's schedule (10 s, 30 s, 1 min, 5 min, ... every 12 h) until
  ``maxDeliveryAttempts`` or the time to live, then dead-lettered as a blob
  ``<container>/<TOPIC>/<SUBSCRIPTION>/yyyy/MM/dd/HH/<id>.json``.

The subscription's state (when it was created, and a watermark of blob
last-modified times already published) is kept in the ``upwell-local-eventgrid``
container, so a restarted host publishes what was written while it was down, as
Event Grid would have delivered it late. Deliveries still waiting for a retry
when the host stops are lost with it; the reconciler finds their blobs.

``EventFaults`` injects faults on this path, per run: dropped, duplicated,
delayed (so reordered) events, and deliveries that fail with 503 (retried) or
are sent with a wrong key (the webhook's real 401: dead-lettered).
"""

from __future__ import annotations

import datetime as dt
import heapq
import itertools
import json
import math
import random
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from urllib.parse import quote

import structlog
from azure.core.exceptions import ResourceNotFoundError

from upwell.errors import ConfigError
from upwell.local.devhost.clients import HostStorage
from upwell.local.devhost.eventgrid import PATH as EVENTGRID_PATH
from upwell.local.devhost.subscriptions import NO_RETRY_STATUS, Subscription
from upwell.local.devhost.webhook import PATH
from upwell.names import LOCAL_EVENTGRID_STATE

log = structlog.get_logger("upwell.local.devhost")
TOPIC = "upwell-local-storage"
SLACK_S = 2.0  # the watermark trails the newest published blob by this much (same-second writes)
FAULTS_SETTING = "UPWELL_EVENT_FAULTS"


@dataclass
class EventFaults:
    """Faults on the event path. Fractions are per event (``fail_5xx``: per delivery attempt).

    Parsed from ``drop=0.1,duplicate=0.2,delay=3,fail_5xx=0.1,fail_401=0.05,seed=1,retry_scale=0.1``
    (the ``UPWELL_EVENT_FAULTS`` setting). ``retry_scale`` multiplies Event Grid's retry schedule.
    """

    drop: float = 0.0
    duplicate: float = 0.0
    delay: float = 0.0
    fail_5xx: float = 0.0
    fail_401: float = 0.0
    seed: int | None = None
    retry_scale: float = 1.0

    @classmethod
    def parse(cls, text: str | None) -> EventFaults:
        if not text or not text.strip():
            return cls()
        known = {f.name: f for f in fields(cls)}
        values: dict = {}
        for part in text.split(","):
            key, sep, value = part.strip().partition("=")
            if not sep or key not in known:
                raise ConfigError(f"{FAULTS_SETTING}: {part.strip()!r}; use name=value with names {sorted(known)}")
            try:
                values[key] = int(value) if key == "seed" else float(value)
            except ValueError:
                raise ConfigError(f"{FAULTS_SETTING}: {key}={value!r} is not a number") from None
        return cls(**values)


@dataclass(order=True)
class Delivery:
    due: float
    seq: int
    subscription: Subscription = field(compare=False)
    event: dict = field(compare=False)
    published: float = field(compare=False)
    attempts: int = field(default=0, compare=False)
    wrong_key: bool = field(default=False, compare=False)
    last_status: int = field(default=0, compare=False)


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat().replace("+00:00", "Z")


def blob_created_event(account: str, container: str, blob, url: str) -> dict:
    """The Event Grid-schema BlobCreated event for one listed blob version."""
    settings = getattr(blob, "content_settings", None)
    return {
        "topic": f"/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/local/providers/"
                 f"Microsoft.Storage/storageAccounts/{account}",
        "subject": f"/blobServices/default/containers/{container}/blobs/{blob.name}",
        "eventType": "Microsoft.Storage.BlobCreated", "id": str(uuid.uuid4()),
        "eventTime": _iso(blob.last_modified.timestamp()), "dataVersion": "", "metadataVersion": "1",
        "data": {"api": "PutBlob", "clientRequestId": str(uuid.uuid4()), "requestId": str(uuid.uuid4()),
                 "eTag": str(blob.etag).strip('"'), "contentType": getattr(settings, "content_type", None),
                 "contentLength": blob.size, "blobType": str(getattr(blob.blob_type, "value", blob.blob_type)),
                 "url": url, "sequencer": f"{int(blob.last_modified.timestamp() * 1e6):032x}",
                 "storageDiagnostics": {"batchId": str(uuid.uuid4())}},
    }


def http_sender(base_url: str) -> Callable[[str, dict, bytes], int]:
    """POST to the host over HTTP; no answer within 30 s (Event Grid's wait) or no connection reads as 0."""
    def send(target: str, headers: dict, body: bytes) -> int:
        request = urllib.request.Request(base_url + target, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except (OSError, urllib.error.URLError):
            return 0
    return send


class Publisher:
    """Publishes and delivers BlobCreated events for the given subscriptions.

    State: per subscription its record (created, watermark) and the blob versions
    already published since the watermark; the heap of pending deliveries; counters.
    """

    def __init__(self, subscriptions: list[tuple[Subscription, HostStorage]], *, state: HostStorage,
                 send: Callable[[str, dict, bytes], int], key: Callable[[Subscription], str],
                 faults: EventFaults | None = None, clock: Callable[[], float] = time.time,
                 scope: str = "default") -> None:
        self.scope = scope  # the function app (host id) whose endpoint the subscriptions point at
        self.subscriptions, self.state, self.send, self.key, self.clock = subscriptions, state, send, key, clock
        self.faults = faults or EventFaults()
        self.rng = random.Random(self.faults.seed)
        self.stats: Counter[str] = Counter()
        self._records: dict[str, dict] = {}
        self._seen: dict[str, dict[tuple[str, str], float]] = {s.name: {} for s, _ in subscriptions}
        self._heap: list[Delivery] = []
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._saved: dict[str, float] = {}

    @property
    def subscribed(self) -> bool:
        """Every subscription exists (its handshake passed)."""
        return len(self._records) == len(self.subscriptions)

    def set_faults(self, faults: EventFaults) -> None:
        """Change the faults for what is published and delivered from now on."""
        self.faults, self.rng = faults, random.Random(faults.seed)

    # -- subscriptions ------------------------------------------------------------------------

    def _record_blob(self, sub: Subscription):
        return self.state.container(LOCAL_EVENTGRID_STATE).get_blob_client(self._state_name(sub))

    def _state_name(self, sub: Subscription) -> str:
        return f"{self.scope}/{sub.name}.json"

    def _open(self, sub: Subscription) -> dict | None:
        """The subscription's record; created (after the validation handshake) when it has none."""
        if sub.name in self._records:
            return self._records[sub.name]
        try:
            record = json.loads(self._record_blob(sub).download_blob().readall())
        except ResourceNotFoundError:
            if not self._validate(sub):
                return None
            now = float(math.floor(self.clock()))  # last-modified times have one-second resolution
            record = {"created": now, "watermark": now, "function": sub.function}
            self.state.upload(LOCAL_EVENTGRID_STATE, self._state_name(sub), json.dumps(record))
            log.info("eventgrid.subscription_created", subscription=sub.name, function=sub.function,
                     filter=sub.subject_begins_with, max_attempts=sub.max_delivery_attempts,
                     dead_letter=sub.dead_letter_container)
        self._records[sub.name] = record
        return record

    def _validate(self, sub: Subscription) -> bool:
        code = str(uuid.uuid4())
        event = [{"id": str(uuid.uuid4()), "topic": TOPIC, "subject": "", "eventTime": _iso(self.clock()),
                  "eventType": "Microsoft.EventGrid.SubscriptionValidationEvent", "metadataVersion": "1",
                  "dataVersion": "1", "data": {"validationCode": code, "validationUrl": ""}}]
        status = self.send(self._target(sub, self.key(sub)), self._headers(sub, "SubscriptionValidation"),
                           json.dumps(event).encode())
        if status != 200:
            log.warning("eventgrid.validation_failed", subscription=sub.name, status=status,
                        note="the subscription is not created; trying again at the next scan")
            return False
        return True

    @staticmethod
    def _target(sub: Subscription, key: str) -> str:
        """The subscription's endpoint: the Event Grid extension names the function as it is, the blobs
        extension by its host id (``Host.Functions.<name>``)."""
        if sub.webhook == "eventgrid":
            return f"{EVENTGRID_PATH}?functionName={quote(sub.function)}&code={quote(key)}"
        return f"{PATH}?functionName=Host.Functions.{quote(sub.function)}&code={quote(key)}"

    @staticmethod
    def _headers(sub: Subscription, kind: str) -> dict[str, str]:
        return {"Content-Type": "application/json", "aeg-event-type": kind, "aeg-subscription-name": sub.name.upper()}

    # -- publishing ---------------------------------------------------------------------------

    def subscribe(self) -> bool:
        """Create every subscription that does not exist yet (handshake); True when all exist."""
        for sub, _ in self.subscriptions:
            self._open(sub)
        return self.subscribed

    def scan(self) -> int:
        """List each subscribed container and publish what is new; returns how many events were published."""
        published = 0
        for sub, storage in self.subscriptions:
            record = self._open(sub)
            if record is not None:
                published += self._scan_one(sub, storage, record)
        return published

    def _scan_one(self, sub: Subscription, storage: HostStorage, record: dict) -> int:
        container = storage.container(sub.container)
        prefix = sub.subject_begins_with.split(f"/containers/{sub.container}/", 1)[-1]
        prefix = prefix[len("blobs/"):] if prefix.startswith("blobs/") else ""
        try:
            blobs = list(container.list_blobs(name_starts_with=prefix or None))
        except ResourceNotFoundError:
            return 0
        seen, watermark, newest, count = self._seen[sub.name], record["watermark"], record["watermark"], 0
        for blob in blobs:
            modified = blob.last_modified.timestamp()
            key = (blob.name, str(blob.etag))
            if modified < watermark - SLACK_S or key in seen:
                continue
            seen[key] = modified
            newest = max(newest, modified)
            if modified < record["created"]:
                continue  # written before the subscription existed: no event on Azure either
            event = blob_created_event(storage.blobs.account_name, sub.container, blob,
                                       container.get_blob_client(blob.name).url)
            if sub.matches(event["eventType"], event["subject"]):
                self._publish(sub, event)
                count += 1
        record["watermark"] = max(watermark, newest - SLACK_S)
        self._seen[sub.name] = {k: t for k, t in seen.items() if t >= record["watermark"] - SLACK_S}
        self._save(sub, record)
        return count

    def _save(self, sub: Subscription, record: dict) -> None:
        if self._saved.get(sub.name) == record["watermark"]:
            return
        self.state.upload(LOCAL_EVENTGRID_STATE, self._state_name(sub), json.dumps(record))
        self._saved[sub.name] = record["watermark"]

    def _publish(self, sub: Subscription, event: dict) -> None:
        faults, now = self.faults, self.clock()
        self.stats["published"] += 1
        if faults.drop and self.rng.random() < faults.drop:
            self.stats["dropped"] += 1
            log.info("eventgrid.fault_dropped", subscription=sub.name, subject=event["subject"])
            return
        copies = 2 if faults.duplicate and self.rng.random() < faults.duplicate else 1
        self.stats["duplicated"] += copies - 1
        for _ in range(copies):
            delay = self.rng.uniform(0, faults.delay) if faults.delay else 0.0
            wrong_key = bool(faults.fail_401 and self.rng.random() < faults.fail_401)
            self._push(Delivery(now + delay, next(self._seq), sub, dict(event), now, wrong_key=wrong_key))

    def _push(self, delivery: Delivery) -> None:
        with self._lock:
            heapq.heappush(self._heap, delivery)

    # -- delivering ---------------------------------------------------------------------------

    def due(self, now: float | None = None) -> list[Delivery]:
        """Take every delivery that is due."""
        now = self.clock() if now is None else now
        taken = []
        with self._lock:
            while self._heap and self._heap[0].due <= now:
                taken.append(heapq.heappop(self._heap))
        return taken

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._heap)

    def deliver(self, delivery: Delivery) -> int:
        """One delivery attempt; schedules the retry or dead-letters. Returns the HTTP status (0: none)."""
        sub, now = delivery.subscription, self.clock()
        delivery.attempts += 1
        if self.faults.fail_5xx and self.rng.random() < self.faults.fail_5xx:
            status = 503  # injected: the endpoint answered 503
            self.stats["failed_5xx"] += 1
        else:
            key = "wrong-" + uuid.uuid4().hex if delivery.wrong_key else self.key(sub)
            status = self.send(self._target(sub, key), self._headers(sub, "Notification"),
                               json.dumps([delivery.event]).encode())
        delivery.last_status = status
        if 200 <= status <= 204:
            self.stats["delivered"] += 1
            return status
        if status in NO_RETRY_STATUS:
            self._dead_letter(delivery, "NonRetriableHttpStatus")
            return status
        wait = sub.retry_delay(delivery.attempts)
        if wait is None:
            self._dead_letter(delivery, "MaxDeliveryAttemptsExceeded")
        elif now + wait - delivery.published > sub.ttl_minutes * 60:
            self._dead_letter(delivery, "TimeToLiveExceeded")
        else:
            self.stats["retried"] += 1
            delivery.due = now + wait * self.faults.retry_scale * self.rng.uniform(0.9, 1.1)
            self._push(delivery)
        return status

    def _dead_letter(self, delivery: Delivery, reason: str) -> None:
        sub, now = delivery.subscription, self.clock()
        doc = [{**delivery.event, "deadLetterReason": reason, "deliveryAttempts": delivery.attempts,
                "lastDeliveryOutcome": _outcome(delivery.last_status), "lastHttpStatusCode": delivery.last_status,
                "publishTime": _iso(delivery.published), "lastDeliveryAttemptTime": _iso(now)}]
        stamp = dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y/%m/%d/%H")
        name = f"{TOPIC.upper()}/{sub.name.upper()}/{stamp}/{delivery.event['id']}.json"
        storage = dict((s.name, st) for s, st in self.subscriptions)[sub.name]
        storage.upload(sub.dead_letter_container, name, json.dumps(doc))
        self.stats["dead_lettered"] += 1
        log.warning("eventgrid.dead_lettered", subscription=sub.name, subject=delivery.event["subject"],
                    reason=reason, status=delivery.last_status, attempts=delivery.attempts,
                    blob=f"{sub.dead_letter_container}/{name}")


def _outcome(status: int) -> str:
    return {0: "TimedOut", 401: "Unauthorized", 403: "Forbidden", 400: "BadRequest",
            413: "RequestEntityTooLarge"}.get(status, "GenericError" if status >= 500 else str(status))
