"""The lease on one received queue message: the only code that renews, releases or deletes it.

Both the worker agent and the local Functions host hold a message this way. A
message is received with a visibility timeout (the lease); ``renew`` pushes it
out again while work runs, ``release(delay_s)`` makes the message visible again
after ``delay_s`` (a retry, a preemption, a deferral), and ``delete`` settles it
for good. Every call updates the pop receipt, so each one uses the latest.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from azure.core.exceptions import AzureError, ResourceNotFoundError

from upwell.storage import storage_error


class Lease:
    """A received message and its latest pop receipt.

    State: the receipt, when it was last renewed, and whether it is settled (released or
    deleted; a settled lease is never renewed again). One lock orders the three verbs.
    ``min_renew_s``: a ``renew()`` sooner than this after the last one does nothing
    (the agent renews from the launcher's tick; ``force=True`` renews anyway).
    """

    def __init__(self, client: Any, message: Any, lease_s: int, *, min_renew_s: float = 0.0) -> None:
        self.client, self.message, self.lease_s = client, message, lease_s
        self.min_renew_s = min_renew_s
        self.pop_receipt = message.pop_receipt
        self._lock = threading.Lock()
        self._renewed = time.monotonic()
        self._settled = False

    def renew(self, force: bool = False) -> None:
        with self._lock:
            if self._settled or (not force and time.monotonic() - self._renewed < self.min_renew_s):
                return
            try:
                updated = self.client.update_message(self.message.id, pop_receipt=self.pop_receipt,
                                                     visibility_timeout=self.lease_s)
            except AzureError as exc:
                raise storage_error(exc, f"renew message {self.message.id}") from None
            self.pop_receipt = updated.pop_receipt
            self._renewed = time.monotonic()

    def release(self, delay_s: float = 0) -> None:
        """Visible again after ``delay_s`` seconds (whole seconds, at least 0)."""
        with self._lock:
            self._settled = True
            try:
                self.client.update_message(self.message.id, pop_receipt=self.pop_receipt,
                                           visibility_timeout=max(0, round(delay_s)))
            except AzureError as exc:
                raise storage_error(exc, f"release message {self.message.id}") from None

    def delete(self) -> None:
        """Settle the message; one that is already gone is fine (its effect is recorded)."""
        with self._lock:
            self._settled = True
            try:
                self.client.delete_message(self.message.id, pop_receipt=self.pop_receipt)
            except ResourceNotFoundError:
                pass
            except AzureError as exc:
                raise storage_error(exc, f"delete message {self.message.id}") from None
