"""``DevHost``: the local Functions host that drives a real ``FunctionApp``.

Build it with the app (``module:attr`` or the object), then either ``start()``
it (listener threads, as ``func start`` would) and ``stop()`` it, or drive it
step by step with ``run_once()`` / ``run_until_idle()`` / ``fire_timer()`` for
deterministic tests. Construction reads host.json and resolves every
``%SETTING%`` and connection, so a missing setting fails at once with its name.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from upwell import logs
from upwell.errors import ConfigError
from upwell.local.devhost.app import FunctionSpec, load_functions
from upwell.local.devhost.blobqueue import BlobQueueListener, Registration, queue_settings
from upwell.local.devhost.blobs import BlobListener, BlobPath
from upwell.local.devhost.clients import Connections, HostStorage, MessageCodec
from upwell.local.devhost.config import DEFAULT_CONNECTION, AppSettings, HostConfig
from upwell.local.devhost.eventgrid import PATH as EVENTGRID_PATH
from upwell.local.devhost.eventgrid import TRIGGER as EVENTGRID_TRIGGER
from upwell.local.devhost.eventgrid import EventGridWebhook
from upwell.local.devhost.invoke import InvocationRecord, Invoker
from upwell.local.devhost.publisher import FAULTS_SETTING, EventFaults, Publisher, http_sender
from upwell.local.devhost.queues import QueueListener
from upwell.local.devhost.renewer import Renewer
from upwell.local.devhost.subscriptions import Subscription, read_template
from upwell.local.devhost.timers import TimerListener
from upwell.local.devhost.web import HttpServer
from upwell.local.devhost.webhook import PATH as WEBHOOK_PATH
from upwell.local.devhost.webhook import BlobWebhook
from upwell.names import blob_trigger_queue

log = logs.get("upwell.local.devhost")
HOST_ID_SETTING = "AzureFunctionsWebHost__hostid"
EVENT_DELIVERIES = 16  # deliveries the local Event Grid keeps in flight at once


def default_host_id(settings: AppSettings) -> str:
    """The host id: the AzureFunctionsWebHost__hostid setting, else from the machine name (as locally)."""
    configured = settings.get(HOST_ID_SETTING)
    if configured:
        return configured
    name = re.sub(r"[^a-z0-9-]", "", socket.gethostname().lower())[:32].strip("-")
    return name or "devhost"


class _Tracker:
    """Submits work to executors and remembers what has not finished, for ``stop()``."""

    def __init__(self) -> None:
        self.pending: dict[Future, tuple[Callable, tuple]] = {}
        self._lock = threading.Lock()

    def submitter(self, executor: ThreadPoolExecutor) -> Callable[..., Future]:
        def submit(fn: Callable, *args: Any) -> Future:
            future = executor.submit(fn, *args)
            with self._lock:
                self.pending[future] = (fn, args)
            future.add_done_callback(self._forget)
            return future
        return submit

    def _forget(self, future: Future) -> None:
        with self._lock:
            self.pending.pop(future, None)

    def snapshot(self) -> dict[Future, tuple[Callable, tuple]]:
        with self._lock:
            return dict(self.pending)


class DevHost:
    """Drives one app's blob, queue, timer and HTTP triggers.

    State: the function specs (loaded once per app object), one listener per
    trigger, their executors and threads, the stop event, and the last
    ``max_records`` invocation records.
    """

    def __init__(self, app_ref: str | Any = "function_app:app", *, connection_string: str | None = None,
                 host_json: Path | str | Mapping | None = None, poll_interval: float = 1.0,
                 port: int | None = 7071, host_id: str | None = None, settings: Mapping[str, str] | None = None,
                 functions: Iterable[str] | None = None, script_root: Path | None = None,
                 shutdown_grace: float = 30.0, max_records: int = 10_000, event_publisher: bool = True,
                 event_faults: EventFaults | None = None) -> None:
        self.script_root = Path(script_root or Path.cwd())
        if host_json is None and (self.script_root / "host.json").exists():
            host_json = self.script_root / "host.json"
        self.config = HostConfig.load(host_json)
        self.settings = AppSettings(settings)
        self.poll_interval, self.port, self.shutdown_grace = poll_interval, port, shutdown_grace
        self.connection_override = connection_string
        self.specs = self._select(load_functions(app_ref, self.script_root), functions)
        self.host_id = host_id or default_host_id(self.settings)
        self.codec = MessageCodec(self.config.queues.message_encoding)
        self._connections = Connections()
        self._records: deque[InvocationRecord] = deque(maxlen=max_records)
        self._records_lock = threading.Lock()
        self.invoker = Invoker(self.settings, self.storage_for, self.codec, self._record,
                               self.config.function_timeout)
        self.invoker.on_queue_write = self._wake_queue
        self.stopping = threading.Event()
        self.renewer = Renewer()
        self._tracker = _Tracker()
        self._threads: list[threading.Thread] = []
        self.http: HttpServer | None = None
        self.event_publisher = event_publisher
        self._event_faults = event_faults
        self._build_listeners()

    @staticmethod
    def _select(specs: list[FunctionSpec], names: Iterable[str] | None) -> list[FunctionSpec]:
        if names is None:
            return specs
        wanted = set(names)
        unknown = wanted - {s.name for s in specs}
        if unknown:
            raise ConfigError(f"--functions: the app has no function {sorted(unknown)}")
        return [s for s in specs if s.name in wanted]

    def storage_for(self, binding: Mapping[str, Any] | None) -> HostStorage:
        """The storage of a binding's connection (or of the override given to the host)."""
        name = (binding or {}).get("connection") or DEFAULT_CONNECTION
        try:
            return self._connections.get(self.connection_override or self.settings.connection_string(name))
        except ValueError as exc:  # the SDK's word for a malformed connection string
            raise ConfigError(f"connection {name!r}: {exc}") from None

    def _resolve(self, spec: FunctionSpec, key: str) -> str:
        return self.settings.resolve(spec.trigger[key], f"function {spec.name}")

    def _build_listeners(self) -> None:
        common = {"invoker": self.invoker, "stopping": self.stopping}
        self.blob_listeners: list[BlobListener] = []
        self.queue_listeners: list[QueueListener] = []
        self.timers: dict[str, TimerListener] = {}
        registrations: dict[str, Registration] = {}
        for spec in self.specs:
            if spec.trigger_type == "blobTrigger" and spec.trigger.get("source") == "EventGrid":
                path = BlobPath.parse(self._resolve(spec, "path"), f"function {spec.name}")
                registrations[spec.function_id] = Registration(spec, path, self.storage_for(spec.trigger))
            elif spec.trigger_type == "blobTrigger":
                self.blob_listeners.append(BlobListener(
                    spec, self._resolve(spec, "path"), source=self.storage_for(spec.trigger),
                    hosts=self.storage_for(None), queues=self.config.queues, codec=self.codec,
                    host_id=self.host_id, renewer=self.renewer, **common))
            elif spec.trigger_type == "queueTrigger":
                self.queue_listeners.append(QueueListener(
                    spec, self._resolve(spec, "queueName").lower(), storage=self.storage_for(spec.trigger),
                    settings=self.config.queues, codec=self.codec, renewer=self.renewer, **common))
            elif spec.trigger_type == "timerTrigger":
                self.timers[spec.name] = TimerListener(spec, self._resolve(spec, "schedule"), **common)
        self.http_specs = [s for s in self.specs if s.trigger_type == "httpTrigger"]
        self._build_event_path(registrations, [s for s in self.specs if s.trigger_type == EVENTGRID_TRIGGER])
        self._blob_pool = ThreadPoolExecutor(self.config.blob_parallelism, thread_name_prefix="devhost-blob")
        self._queue_pools = {id(q): ThreadPoolExecutor(q.concurrency, thread_name_prefix=f"devhost-{q.queue}")
                             for q in self.queue_listeners}
        self._timer_pool = ThreadPoolExecutor(max(1, len(self.timers)), thread_name_prefix="devhost-timer")
        # Event Grid keeps many deliveries in flight, and an Event Grid trigger runs inside its delivery.
        self._event_pool = ThreadPoolExecutor(EVENT_DELIVERIES, thread_name_prefix="devhost-eventgrid")

    def _build_event_path(self, registrations: dict[str, Registration], eventgrid: list[FunctionSpec]) -> None:
        """What Event Grid delivers to: ``source=EventGrid`` blob triggers (the host queue and the blobs
        webhook), Event Grid triggers (their webhook runs them), and the local event publisher for both."""
        self.blob_queue: BlobQueueListener | None = None
        self.webhook: BlobWebhook | None = None
        self.eventgrid_webhook: EventGridWebhook | None = None
        self.publisher: Publisher | None = None
        hosts, config = self.storage_for(None), self.config
        if registrations:
            self.blob_queue = BlobQueueListener(
                registrations, blob_trigger_queue(self.host_id), storage=hosts, codec=self.codec,
                renewer=self.renewer, invoker=self.invoker, stopping=self.stopping,
                settings=queue_settings(config.blob_parallelism, config.poison_blob_threshold,
                                        config.queues.max_polling_interval, config.queues.message_encoding))
            self.webhook = BlobWebhook(hosts, self.host_id, self.codec, on_enqueue=self.blob_queue.wake)
        if eventgrid:
            self.eventgrid_webhook = EventGridWebhook(hosts, self.host_id, eventgrid, self.invoker.invoke)
        if not self.event_publisher or not (registrations or eventgrid):
            return
        template = read_template(self.script_root)
        subscriptions = [(template.subscription(r.spec.name, r.path.container), r.source)
                         for r in registrations.values()]
        for spec in eventgrid:
            container = template.containers.get(spec.name)
            if container is None:
                log.warning("devhost.eventgrid_unsubscribed", function=spec.name,
                            note="no entry of bicep/main.bicep's blobTriggers names it: no event reaches it")
                continue
            subscriptions.append((template.subscription(spec.name, container), self.storage_for(spec.trigger)))
        faults = self._event_faults or EventFaults.parse(self.settings.get(FAULTS_SETTING))
        self.publisher = Publisher(subscriptions, state=hosts, send=self._send_direct, key=self._system_key,
                                   faults=faults, scope=self.host_id)

    @property
    def webhooks(self) -> dict[str, Any]:
        """The host's webhooks by path: what an Event Grid subscription's endpoint reaches."""
        found = {WEBHOOK_PATH: self.webhook, EVENTGRID_PATH: self.eventgrid_webhook}
        return {path: hook for path, hook in found.items() if hook is not None}

    def _system_key(self, sub: Subscription) -> str:
        """The system key that the subscription's endpoint carries (listKeys in events.bicep)."""
        return self.webhooks[EVENTGRID_PATH if sub.webhook == "eventgrid" else WEBHOOK_PATH].key

    def _send_direct(self, target: str, headers: dict, body: bytes) -> int:
        """In-process delivery to a webhook (no HTTP server: step-by-step tests, ``port=None``)."""
        hook = self.webhooks.get(urlsplit(target).path.rstrip("/").lower())
        return 404 if hook is None else hook.handle("POST", target, headers, body)[0]

    def _submit_blob(self, fn: Callable, *args: Any) -> Future:
        return self._tracker.submitter(self._blob_pool)(fn, *args)

    def _submit_queue(self, listener: QueueListener) -> Callable[..., Future]:
        return self._tracker.submitter(self._queue_pools[id(listener)])

    def _wake_queue(self, queue: str) -> None:
        for listener in self.queue_listeners:
            if listener.queue == queue:
                listener.wake()

    def _record(self, record: InvocationRecord) -> None:
        with self._records_lock:
            self._records.append(record)

    @property
    def invocations(self) -> list[InvocationRecord]:
        """The invocation records so far, oldest first."""
        with self._records_lock:
            return list(self._records)

    # Driving step by step (tests) --------------------------------------------------------------

    def run_once(self, timeout: float | None = None) -> int:
        """One scan of every blob trigger and one receive of every queue trigger, run to completion.

        Timers are not fired (use ``fire_timer``). Returns how many blobs and messages were handled.
        """
        self._check_open()
        self.renewer.start()
        futures = []
        if self.publisher is not None:
            self.publisher.scan()
            for delivery in self.publisher.due():
                self.publisher.deliver(delivery)
        if self.blob_queue is not None:
            submit = self._tracker.submitter(self._blob_pool)
            futures += [submit(self.blob_queue.process, message) for message in self.blob_queue.receive()]
        for blobs in self.blob_listeners:
            futures += [self._submit_blob(blobs.process, claim) for claim in blobs.scan()]
        for queue in self.queue_listeners:
            submit = self._submit_queue(queue)
            futures += [submit(queue.process, message) for message in queue.receive()]
        wait(futures, timeout)
        return len(futures)

    def run_until_idle(self, max_rounds: int = 50, timeout: float | None = None) -> int:
        """``run_once`` until a round handles nothing; returns the total handled."""
        total = 0
        for _ in range(max_rounds):
            handled = self.run_once(timeout)
            total += handled
            if handled == 0:
                break
        return total

    def fire_timer(self, name: str) -> Future | None:
        """Fire a timer function now; None when its previous run is still going (skipped)."""
        try:
            timer = self.timers[name]
        except KeyError:
            raise ConfigError(f"no timer function {name!r}; timers: {sorted(self.timers)}") from None
        self._check_open()
        self.renewer.start()
        return timer.fire(self._tracker.submitter(self._timer_pool))

    # Running in the background -----------------------------------------------------------------

    @property
    def http_url(self) -> str | None:
        return self.http.url if self.http else None

    def start(self) -> DevHost:
        """Start the listener threads and the HTTP server; returns at once."""
        self._check_open()
        self.renewer.start()
        if (self.http_specs or self.webhooks) and self.port is not None:
            self.http = HttpServer(self.http_specs, self.invoker, port=self.port, prefix=self.config.route_prefix,
                                   webhooks=self.webhooks)
            self.http.start()
            if self.publisher is not None:
                self.publisher.send = http_sender(self.http.url)
        if self.blob_queue is not None:
            self._spawn("blob-queue", self.blob_queue.run, self._tracker.submitter(self._blob_pool))
        if self.publisher is not None:
            try:  # the subscriptions exist before start() returns, so an upload right after gets its event
                self.publisher.subscribe()
            except Exception as exc:  # noqa: BLE001 - storage down: the publisher loop subscribes later
                log.warning("devhost.event_subscriptions_pending", error=f"{type(exc).__name__}: {exc}")
            self._spawn("eventgrid", self._publisher_loop, self.publisher)
        for blobs in self.blob_listeners:
            self._spawn(f"blob-{blobs.spec.name}", self._blob_loop, blobs)
        for queue in self.queue_listeners:
            self._spawn(f"queue-{queue.spec.name}", queue.run, self._submit_queue(queue))
        for timer in self.timers.values():
            self._spawn(f"timer-{timer.spec.name}", timer.run, self._tracker.submitter(self._timer_pool))
        log.info("devhost.started", host_id=self.host_id, functions=[s.name for s in self.specs],
                 http=self.http_url)
        return self

    def _check_open(self) -> None:
        if self.stopping.is_set():
            raise RuntimeError("this DevHost has been stopped; build a new one")

    def _spawn(self, name: str, target: Callable, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=f"devhost-{name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _blob_loop(self, listener: BlobListener) -> None:
        while not self.stopping.is_set():
            try:
                for claim in listener.scan():
                    self._submit_blob(listener.process, claim)
            except Exception as exc:  # noqa: BLE001 - a periodic loop: storage down, log and scan again later
                log.warning("devhost.blob_scan_failed", function=listener.spec.name,
                            error=f"{type(exc).__name__}: {exc}")
            self.stopping.wait(self.poll_interval)

    def _publisher_loop(self, publisher: Publisher) -> None:
        """Scan for new blobs every poll interval and deliver what is due (Event Grid stand-in)."""
        submit = self._tracker.submitter(self._event_pool)
        last_scan = 0.0
        while not self.stopping.is_set():
            now = time.monotonic()
            if now - last_scan >= self.poll_interval:
                last_scan = now
                try:
                    publisher.scan()
                except Exception as exc:  # noqa: BLE001 - a periodic loop: storage down, scan again later
                    log.warning("devhost.event_scan_failed", error=f"{type(exc).__name__}: {exc}")
            for delivery in publisher.due():
                submit(self._deliver, publisher, delivery)
            self.stopping.wait(min(0.1, self.poll_interval))

    def _deliver(self, publisher: Publisher, delivery) -> None:
        try:
            publisher.deliver(delivery)
        except Exception as exc:  # noqa: BLE001 - an attempt that cannot even be made is retried later
            log.warning("devhost.event_delivery_failed", error=f"{type(exc).__name__}: {exc}")
            delivery.due = time.time() + 10 * publisher.faults.retry_scale
            publisher._push(delivery)

    def stop(self, grace: float | None = None) -> int:
        """Stop listening, release work not yet started, and wait up to ``grace`` s for running work.

        Returns how many invocations were still running when the grace ran out; their
        threads finish on their own and their leases lapse (the input runs again later).
        """
        grace = self.shutdown_grace if grace is None else grace
        self.stopping.set()
        for queue in self.queue_listeners:
            queue.wake()
        if self.blob_queue is not None:
            self.blob_queue.wake()
        if self.http:
            self.http.stop()
            self.http = None
        for thread in self._threads:
            thread.join(5)
        self._threads.clear()
        for future, (fn, args) in self._tracker.snapshot().items():
            if future.cancel():
                fn(*args)  # a listener's process() sees `stopping` and releases its lease
        _, running = wait(list(self._tracker.snapshot()), grace)
        if running:
            log.warning("devhost.stopped_with_invocations_running", count=len(running),
                        note="their leases lapse and the messages or blobs run again later")
        for pool in (self._blob_pool, self._timer_pool, self._event_pool, *self._queue_pools.values()):
            pool.shutdown(wait=False, cancel_futures=True)
        self.renewer.stop()
        log.info("devhost.stopped", host_id=self.host_id)
        return len(running)

    def __enter__(self) -> DevHost:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()
