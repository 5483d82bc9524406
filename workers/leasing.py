"""The lease loop: receive work items from one pool's queue, each under a visibility lease, and hand
each to the agent, up to ``slots`` at once.

One receive asks for up to as many messages as there are free slots; each is leased for ``lease_s``
from then (``upwell.lease.Lease`` renews it while the payload runs), so it never asks for more. A slot that
frees while others are busy waits up to ``refill_s`` for the rest to free too, so that one Get Messages call
(Queue REST ``numofmessages``, at most 32) fills them all: short shards then cost one receive per batch of
slots, not one each (issue 24), and a long shard's freed slot idles at most ``refill_s``. The Functions
host's queue trigger batches the same way (``batchSize``, ``newBatchThreshold``), with a count bound where
this has a time bound, since here the slots are the node's cores. With one slot each item runs in the
loop's thread; with more, each in a slot thread of its own. The loop ends when ``stop`` (preempt: items in
hand checkpoint and go back) or ``drain`` (items in hand finish) is set, after ``idle_exit_s`` without
work (a message put back for an agent of another shape is none: a gang holding k nodes that sees only
one-node shards leaves, and lets them have its nodes), or at ``max_items``. A failed receive is logged
and waited out; a handler that crashes is logged, and its message reappears when its lease lapses.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any

from upwell.errors import UpwellError
from upwell.lease import Lease
from upwell.storage import Storage
from workers.node import Node
from workers.settle import SHAPE_DEFERRED

if TYPE_CHECKING:
    from workers.agent_config import AgentConfig


class LeaseLoop:
    """State: how many messages were handled (``processed``), under a lock the slots share."""

    def __init__(self, storage: Storage, queue_name: str, config: AgentConfig, node: Node, *, stop: threading.Event,
                 drain: threading.Event, log: Any) -> None:
        self.storage, self.queue_name, self.config, self.node = storage, queue_name, config, node
        self.queue = storage.queue(queue_name)
        self.stop, self.drain, self.log = stop, drain, log
        self.processed = 0
        self._worked = time.monotonic()  # when a message last meant work for this agent (the idle clock)
        self._lock = threading.Lock()

    def lease(self, msg) -> Lease:
        """The message's lease: renewed at most every lease_s / 3 while its payload runs."""
        return Lease(self.queue, msg, self.config.lease_s, min_renew_s=self.config.lease_s / 3)

    def run(self, handle: Callable[[Any], str]) -> int:
        """Receive and ``handle`` messages until stopped, drained, idle or at max_items; 0."""
        slots = max(1, self.config.slots)
        threads = ThreadPoolExecutor(slots, thread_name_prefix="upwell-slot") if slots > 1 else None
        inflight: set[Future] = set()
        self._worked = time.monotonic()
        self.node.state("idle")
        try:
            while not self.stop.is_set() and not self.drain.is_set():
                if self.node.tick():  # the scaler marked this node draining: take no new work
                    self.drain.set()
                    break
                inflight = self._refill_wait({f for f in inflight if not f.done()}, slots)
                want = self._wanted(slots, len(inflight))
                msgs = self._receive(want) if want > 0 else []
                if not msgs and not inflight:
                    self.node.idle()  # only now: between two batches the node stays running in the nodes table
                if msgs:
                    if self._hand_out(handle, msgs, threads, inflight):
                        break  # only other agents' shapes came
                elif inflight:  # busy slots and nothing more to take: wait for one (or poll again)
                    wait(inflight, timeout=self.config.poll_s, return_when=FIRST_COMPLETED)
                    self._worked = time.monotonic()
                elif want <= 0:
                    break  # max_items reached
                elif msgs is not None and self._idle_out(self._worked):
                    break
        finally:
            if threads is not None:  # items in hand finish (drain) or checkpoint and go back (stop)
                threads.shutdown(wait=True)
        self.node.stopped(drained=self.drain.is_set() and not self.stop.is_set())
        return 0

    def _hand_out(self, handle: Callable[[Any], str], msgs: list, threads: ThreadPoolExecutor | None,
                  inflight: set[Future]) -> bool:
        """Handle ``msgs`` here (one slot) or in the slots' threads; True when a one-slot agent that got only
        other agents' shapes has been idle past idle_exit_s."""
        for msg in msgs:
            if threads is None:
                self._one(handle, msg)
            else:
                inflight.add(threads.submit(self._one, handle, msg))
        return threads is None and self._idle_out(self._worked, wait=False)

    def _refill_wait(self, inflight: set[Future], slots: int) -> set[Future]:
        """The slots still busy, after waiting up to refill_s for every busy one to free when some are free
        and some busy (none is waited for with every slot free, or every slot busy)."""
        if not inflight or len(inflight) >= slots or self.config.refill_s <= 0:
            return inflight
        wait(inflight, timeout=self.config.refill_s, return_when=ALL_COMPLETED)
        return {f for f in inflight if not f.done()}

    def _idle_out(self, idle_since: float, *, wait: bool = True) -> bool:
        """Nothing to do: True when the agent has been idle past idle_exit_s, else (``wait``) wait one poll."""
        if self.config.idle_exit_s and time.monotonic() - idle_since > self.config.idle_exit_s:
            self.log.info("agent.idle_exit", processed=self.processed)
            return True
        if wait:
            self.stop.wait(self.config.poll_s)
        return False

    def _receive(self, want: int) -> list | None:
        """Up to ``want`` messages, each leased for lease_s; None after a failed receive (waited out)."""
        try:
            return self.storage.receive_many(self.queue_name, max_messages=want, visibility_timeout=self.config.lease_s)
        except UpwellError as exc:
            self.log.warning("agent.receive_failed", error=str(exc).splitlines()[0][:200], code=exc.code)
            self.stop.wait(self.config.poll_s * 2)
            return None

    def _wanted(self, slots: int, busy: int) -> int:
        """How many messages to ask for: the free slots, and no more than max_items leaves."""
        free = slots - busy
        if self.config.max_items:
            with self._lock:
                free = min(free, self.config.max_items - self.processed - busy)
        return free

    def _one(self, handle: Callable[[Any], str], msg) -> None:
        """Handle one message in its slot; a crash is logged and the message reappears after its lease."""
        try:
            if handle(msg) != SHAPE_DEFERRED:
                self._worked = time.monotonic()
        except Exception as exc:
            self.log.exception("agent.handle_crashed", error=str(exc)[:300])
            self._worked = time.monotonic()
        with self._lock:
            self.processed += 1
        self.node.refresh()
