"""The adapter from Azure SDK errors to PoolError: the only place that reads them.

``pool_error(exc, pool=..., action=...)`` turns an azure-core/azure-identity
exception into a PoolError whose ``kind`` says what to do about it:

- quota: the subscription or Batch account has no vCPU (or pool) quota left;
  permanent until someone raises the quota (1-2 business days);
- capacity: Azure has no such VMs in the region/zone now; retry later or
  elsewhere;
- auth: the identity lacks a role assignment, or no credential is available;
- throttled: 429/503, with ``retry_after`` from the Retry-After header (the
  SDK's RetryPolicy already retried; this is what remains);
- not_found / other.

Callers write ``except AzureError as exc: raise pool_error(exc, ...) from None``.
"""

from __future__ import annotations

import re
from typing import Any

from upwell.errors import PoolError, PoolErrorKind

QUOTA_CODES = frozenset(c.lower() for c in (
    "QuotaExceeded", "AccountCoreQuotaReached", "AccountLowPriorityCoreQuotaReached",
    "AccountSpotCoreQuotaReached", "AccountVMSeriesCoreQuotaReached", "PoolQuotaReached",
    "ContainerGroupQuotaReached", "StandardCoresQuotaReached", "ResourceQuotaExceeded",
    "SubscriptionQuotaExceeded", "LowPriorityCoreQuotaReached", "SpotCoreQuotaReached",
))
CAPACITY_CODES = frozenset(c.lower() for c in (
    "SkuNotAvailable", "AllocationFailed", "ZonalAllocationFailed", "OverconstrainedAllocationRequest",
    "OverconstrainedZonalAllocationRequest", "AllocationTimedout", "InsufficientCapacity",
    "ServiceUnavailableCapacity", "SkuNotAvailableInRegion", "ResourceUnavailable",
))
AUTH_CODES = frozenset(c.lower() for c in (
    "AuthorizationFailed", "AuthenticationFailed", "InvalidAuthenticationToken", "LinkedAuthorizationFailed",
    "InvalidAuthenticationTokenTenant", "Forbidden", "AuthorizationPermissionMismatch",
    "InsufficientAccountPermissions",
))
NOT_FOUND_CODES = frozenset(c.lower() for c in (
    "ResourceNotFound", "ResourceGroupNotFound", "PoolNotFound", "NodeNotFound", "NotFound",
    "ParentResourceNotFound",
))
THROTTLE_CODES = frozenset(c.lower() for c in ("TooManyRequests", "ServerBusy", "ServiceUnavailable"))
_QUOTA_TEXT = re.compile(r"\bquota\b", re.I)
_ARM_QUOTA = re.compile(
    r"exceeding approved (?P<family>[\w ]+?) quota.*?Current Limit: (?P<limit>\d+), "
    r"Current Usage: (?P<usage>\d+), Additional Required: (?P<need>\d+)", re.I | re.S)


def pool_error(exc: BaseException, *, pool: str, action: str) -> PoolError:
    """A PoolError for an SDK exception; the message names the pool, the action and Azure's code."""
    if isinstance(exc, PoolError):
        return exc
    status, code, text = _status(exc), _code(exc), _text(exc)
    kind = classify(status, code, text, exc)
    retry_after = _retry_after(exc) if kind is PoolErrorKind.THROTTLED else None
    return PoolError(_message(kind, pool, action, status, code, text, retry_after), kind=kind,
                     retry_after=retry_after)


def classify(status: int | None, code: str, text: str, exc: BaseException | None = None) -> PoolErrorKind:
    """The PoolErrorKind for an HTTP status, an Azure error code and its message."""
    low = code.lower()
    if low in QUOTA_CODES or (low == "operationnotallowed" and _QUOTA_TEXT.search(text)) or \
            ("quota" in low and "exceed" in low):
        return PoolErrorKind.QUOTA
    if low in CAPACITY_CODES:
        return PoolErrorKind.CAPACITY
    if status in (401, 403) or low in AUTH_CODES or _is_auth_exception(exc):
        return PoolErrorKind.AUTH
    if status in (429, 503) or low in THROTTLE_CODES:
        return PoolErrorKind.THROTTLED
    if status == 404 or low in NOT_FOUND_CODES:
        return PoolErrorKind.NOT_FOUND
    return PoolErrorKind.OTHER


def quota_detail(text: str) -> dict[str, Any] | None:
    """family, limit, usage and need parsed from ARM's quota message, if it is one."""
    m = _ARM_QUOTA.search(text or "")
    if not m:
        return None
    family = re.sub(r"\s+(cores|vcpus)$", "", m["family"].strip(), flags=re.I)
    return {"family": family, "limit": int(m["limit"]), "usage": int(m["usage"]),
            "need": int(m["need"])}


def describe_resize_errors(pool: str, errors: list[Any] | None) -> tuple[PoolErrorKind | None, str]:
    """What a Batch pool's asynchronous ``resizeErrors`` say, as (kind, message); (None, "") if none."""
    if not errors:
        return None, ""
    parts, kinds = [], []
    for err in errors:
        code = str(getattr(err, "code", "") or "")
        text = str(getattr(err, "message", "") or "")
        kinds.append(classify(None, code, text))
        parts.append(f"{code}: {text}".strip(": "))
    kind = next((k for k in (PoolErrorKind.QUOTA, PoolErrorKind.CAPACITY, PoolErrorKind.AUTH) if k in kinds),
                kinds[0])
    hint = _HINTS.get(kind, "")
    return kind, f"pool {pool} could not reach its target: {'; '.join(parts)}" + (f" ({hint})" if hint else "")


_HINTS = {
    PoolErrorKind.QUOTA: "raise the vCPU quota for this VM family; a raise can take 1-2 business days",
    PoolErrorKind.CAPACITY: "Azure has no capacity for this size here now; retry later, or another region or size",
    PoolErrorKind.AUTH: "give the scaler's identity a role on the resource (e.g. Contributor)",
}


def _message(kind: PoolErrorKind, pool: str, action: str, status: int | None, code: str, text: str,
             retry_after: float | None) -> str:
    head = f"pool {pool}: {action} failed"
    detail = quota_detail(text) if kind is PoolErrorKind.QUOTA else None
    if detail:
        head = (f"pool {pool} needs {detail['need']} more cores of {detail['family']} quota "
                f"({detail['usage']} of {detail['limit']} in use): {action} failed")
    what = " ".join(x for x in (f"HTTP {status}" if status else "", code) if x)
    msg = f"{head} ({what})" if what else head
    if text:
        msg += f": {text.strip()[:500].rstrip('.')}"
    if retry_after is not None:
        msg += f"; retry after {retry_after:g} s"
    hint = _HINTS.get(kind)
    return msg + (f". Hint: {hint}" if hint else "")


def has_code(exc: BaseException, *codes: str) -> bool:
    """Whether Azure's error code on ``exc`` is one of ``codes`` (case-insensitive): a 409 JobExists on a
    create is success, a 409 JobBeingDeleted is not."""
    return _code(exc).lower() in {c.lower() for c in codes}


def _status(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    if status is None:
        status = getattr(getattr(exc, "response", None), "status_code", None)
    return int(status) if isinstance(status, int) else None


def _code(exc: BaseException) -> str:
    error = getattr(exc, "error", None)
    code = getattr(error, "code", None) or getattr(exc, "error_code", None)
    if not code and error is not None:
        code = getattr(getattr(error, "innererror", None), "code", None)
    return str(code or "")


def _text(exc: BaseException) -> str:
    error = getattr(exc, "error", None)
    text = getattr(error, "message", None)
    if isinstance(text, dict):  # Batch puts {"lang": .., "value": ..} here
        text = text.get("value")
    if not text:
        text = getattr(exc, "message", None) or str(exc)
    details = getattr(error, "details", None) or []
    extra = " ".join(str(getattr(d, "message", "") or "") for d in details if getattr(d, "message", None))
    text = str(text).split("\nContent:")[0].split("\nCode:")[0].strip()
    return f"{text} {extra}".strip() if extra and extra not in text else text


def _retry_after(exc: BaseException) -> float | None:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None) or {}
    for name in ("Retry-After", "retry-after", "x-ms-retry-after-ms", "retry-after-ms"):
        value = headers.get(name) if hasattr(headers, "get") else None
        if value is None:
            continue
        try:
            seconds = float(value)
        except ValueError:
            continue
        return seconds / 1000.0 if name.endswith("ms") else seconds
    return None


def _is_auth_exception(exc: BaseException | None) -> bool:
    if exc is None:
        return False
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(names & {"ClientAuthenticationError", "CredentialUnavailableError", "AuthenticationRequiredError"})
