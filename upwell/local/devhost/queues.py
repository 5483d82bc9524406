"""Queue triggers with the Functions host's host.json semantics.

A listener receives up to ``batchSize`` messages with a visibility lease of
``LEASE_S`` (10 min, renewed every 5 min while the function runs, as the host
does), runs them concurrently, and receives the next batch once the number in
flight falls to ``newBatchThreshold``. An empty queue is polled again after a
delay that doubles from 0.1 s up to ``maxPollingInterval``; an output binding
of this host that writes to the queue wakes the listener at once.

Success deletes the message. Failure makes it visible again after
``visibilityTimeout``. A message whose dequeue count has reached
``maxDequeueCount`` when it fails, or exceeds it when it arrives (its last
run crashed), is copied as is to ``<queue>-poison`` (created when missing) and
deleted. The function gets the real id, dequeue count, times and pop receipt.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

from azure.core.exceptions import ResourceNotFoundError
from azure.functions.queue import QueueMessage as FuncQueueMessage
from azure.storage.queue import QueueMessage

from upwell import logs
from upwell.lease import Lease
from upwell.local.devhost.app import FunctionSpec
from upwell.local.devhost.clients import HostStorage, MessageCodec
from upwell.local.devhost.config import QueueSettings
from upwell.local.devhost.invoke import Invoker
from upwell.local.devhost.renewer import Renewer
from upwell.names import poison_queue

log = logs.get("upwell.local.devhost")
LEASE_S = 600
MIN_POLL_S = 0.1


def trigger_data(message: QueueMessage, body: bytes) -> dict[str, Any]:
    """Binding data: the host's queue metadata, plus the top-level fields of a JSON object body."""
    data: dict[str, Any] = {}
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        data.update(parsed)
    data.update({"QueueTrigger": body.decode("utf-8", "replace"), "Id": message.id,
                 "DequeueCount": message.dequeue_count, "InsertionTime": message.inserted_on,
                 "ExpirationTime": message.expires_on, "NextVisibleTime": message.next_visible_on,
                 "PopReceipt": message.pop_receipt})
    return data


class QueueListener:
    """Receives and settles the messages of one queue-trigger function.

    State: the number of messages in flight (under a condition), and the wake event.
    """

    def __init__(self, spec: FunctionSpec | None, queue: str, *, storage: HostStorage, invoker: Invoker,
                 settings: QueueSettings, codec: MessageCodec, renewer: Renewer, stopping: threading.Event,
                 lease_s: int = LEASE_S) -> None:
        self.spec, self.queue, self.storage, self.invoker = spec, queue, storage, invoker
        self.settings, self.codec, self.renewer, self.stopping = settings, codec, renewer, stopping
        self.lease_s = lease_s
        self.label = spec.name if spec is not None else queue
        self.poison_target = poison_queue(queue)
        self.client = storage.queue(queue)
        self.in_flight = 0
        self._cond = threading.Condition()
        self._wake = threading.Event()

    @property
    def concurrency(self) -> int:
        """The most messages in flight at once: a batch on top of the threshold."""
        return self.settings.batch_size + self.settings.new_batch_threshold

    def wake(self) -> None:
        self._wake.set()
        with self._cond:
            self._cond.notify_all()

    def receive(self) -> list[QueueMessage]:
        """One receive of up to ``batchSize`` messages; a queue that does not exist yet is empty."""
        size = self.settings.batch_size
        try:
            messages = list(self.client.receive_messages(messages_per_page=size, max_messages=size,
                                                         visibility_timeout=self.lease_s))
        except ResourceNotFoundError:
            return []
        with self._cond:
            self.in_flight += len(messages)
        return messages

    def poll(self, submit: Callable[..., Any]) -> int:
        messages = self.receive()
        for message in messages:
            submit(self.process, message)
        return len(messages)

    def run(self, submit: Callable[..., Any]) -> None:
        """The listener loop: receive when few enough are in flight, back off while empty."""
        delay = MIN_POLL_S
        while not self.stopping.is_set():
            with self._cond:
                self._cond.wait_for(lambda: self.in_flight <= self.settings.new_batch_threshold
                                    or self.stopping.is_set(), timeout=1.0)
                if self.in_flight > self.settings.new_batch_threshold:
                    continue
            try:
                got = self.poll(submit)
            except Exception as exc:  # noqa: BLE001 - a periodic loop: storage down or throttled, back off, go on
                log.warning("devhost.queue_receive_failed", function=self.label, queue=self.queue,
                            error=f"{type(exc).__name__}: {exc}")
                got = 0
            if got:
                delay = MIN_POLL_S
                continue
            self._wake.wait(delay)
            self._wake.clear()
            delay = min(delay * 2, max(self.settings.max_polling_interval, MIN_POLL_S))

    def process(self, message: QueueMessage) -> None:
        """Run the function for one message and settle it; never raises."""
        leased = Lease(self.client, message, self.lease_s)
        renewal = self.renewer.add(leased.renew, self.lease_s / 2)
        try:
            self._settle(leased)
        except Exception as exc:  # noqa: BLE001 - a worker thread never dies: the message comes back after its lease
            log.warning("devhost.queue_bookkeeping_failed", function=self.label, queue=self.queue,
                        message_id=message.id, error=f"{type(exc).__name__}: {exc}")
        finally:
            self.renewer.remove(renewal)
            with self._cond:
                self.in_flight -= 1
                self._cond.notify_all()

    def _settle(self, leased: Lease) -> None:
        message, limit = leased.message, self.settings.max_dequeue_count
        if self.stopping.is_set():
            return leased.release(0)  # not started: visible again at once for the next host
        if message.dequeue_count > limit:
            return self._poison(leased)
        body = self.codec.decode(message.content or "")
        argument = FuncQueueMessage(
            id=message.id, body=body, dequeue_count=message.dequeue_count,
            expiration_time=message.expires_on, insertion_time=message.inserted_on,
            time_next_visible=message.next_visible_on, pop_receipt=leased.pop_receipt)
        if self.invoker.invoke(self.spec, argument, trigger_data(message, body)).ok:
            leased.delete()
        elif message.dequeue_count >= limit:
            self._poison(leased)
        else:
            leased.release(self.settings.visibility_timeout)

    def _poison(self, leased: Lease) -> None:
        target = self.poison_target
        self.storage.send(target, leased.message.content or "")
        leased.delete()
        log.error("devhost.queue_message_poisoned", function=self.label, queue=self.queue, poison_queue=target,
                  message_id=leased.message.id, dequeue_count=leased.message.dequeue_count)
