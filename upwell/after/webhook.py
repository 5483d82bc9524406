"""A webhook delivery: one CloudEvent POSTed in structured mode, signed with HMAC-SHA256 over the exact
body, retried with backoff.

The signature header is ``X-Upwell-Signature-256: sha256=<hex>`` (the scheme GitHub's webhooks use:
HMAC-SHA256 of the raw body under the shared secret, hex, compared in constant time by the receiver:
docs/after-the-job.md shows the check). A 2xx answer is delivered; 408, 429 and 5xx, a refused connection and no answer
within the timeout are tried again after ``backoff_s``, doubling; any other 4xx is final at once.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import requests

from upwell.after.cloudevents import MEDIA_TYPE
from upwell.errors import DeliveryFailed

SIGNATURE_HEADER = "X-Upwell-Signature-256"
RETRYABLE = frozenset({408, 429})


@dataclass(frozen=True)
class Policy:
    """How hard one delivery tries: attempts in all, the first wait, one try's timeout (seconds)."""

    attempts: int = 5
    backoff_s: float = 2.0
    timeout_s: float = 10.0


def body_of(event: dict) -> bytes:
    """The exact bytes that are signed and sent."""
    return json.dumps(event, separators=(",", ":"), sort_keys=True).encode()


def sign(body: bytes, secret: bytes) -> str:
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def deliver(url: str, event: dict, secret: bytes, policy: Policy,
            sleep: Callable[[float], None] = time.sleep) -> int:
    """POST the event until the receiver takes it; the number of tries it took. DeliveryFailed when every
    try failed, or one was refused for good (a 4xx other than 408/429)."""
    body = body_of(event)
    headers = {"Content-Type": MEDIA_TYPE, SIGNATURE_HEADER: sign(body, secret),
               "User-Agent": "upwell-notify/1", "ce-id": str(event.get("id", ""))}
    last, status = "", None
    for attempt in range(1, policy.attempts + 1):
        if attempt > 1:
            sleep(policy.backoff_s * 2 ** (attempt - 2))
        try:
            answer = requests.post(url, data=body, headers=headers, timeout=policy.timeout_s, allow_redirects=False)
        except requests.Timeout:
            last, status = f"no answer within {policy.timeout_s:g} s", None
            continue
        except requests.RequestException as exc:
            last, status = f"{type(exc).__name__}: {str(exc)[:200]}", None
            continue
        status = answer.status_code
        if 200 <= status < 300:
            return attempt
        last = f"HTTP {status}"
        if status < 500 and status not in RETRYABLE:
            raise DeliveryFailed(f"{url}: refused with {last} on try {attempt}", status=status)
    raise DeliveryFailed(f"{url}: {last} after {policy.attempts} tries", status=status)
