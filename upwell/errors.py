"""One error hierarchy for upwell.

A *permanent* error (InputRejected, DecodeError, BudgetExceeded, a payload that
is not registered) is recorded and dropped. A *transient* error (TransientError,
PoolError with a retryable kind) is raised so that the host redelivers.
SDK errors are translated into these only in adapters, with ``raise ... from None``.
"""

from __future__ import annotations

from enum import Enum


class UpwellError(Exception):
    """Base of every error upwell raises on purpose.

    ``permanent``: retrying the same input cannot help (the handlers record and drop
    it); otherwise they raise it so that the host redelivers. ``code`` is the
    service's error code where a service said no (e.g. "BlobNotFound").
    """

    permanent = True
    code = ""


class InputRejected(UpwellError):
    """Bad input. ``field`` names the field, row or limit that failed."""

    def __init__(self, message: str, *, field: str = "", row: int | None = None,
                 limit: str = "", source: str = ""):
        super().__init__(message)
        self.message = message
        self.field = field
        self.row = row
        self.limit = limit
        self.source = source
        # Every bad row found (upwell.ingest.badrows): [{"row", "field", "message"}], and whether there may be more.
        self.rows: list[dict] = []
        self.more_rows = False

    def to_dict(self) -> dict:
        rows = self.rows or ([{"row": self.row, "field": self.field, "message": self.message}]
                             if self.row is not None else [])
        return {"error": type(self).__name__, "message": self.message, "field": self.field,
                "row": self.row, "limit": self.limit, "source": self.source, "rows": rows,
                "more_rows": self.more_rows}


class RedriveExhausted(InputRejected):
    """An input the reconciler re-drove ``max_redrives`` times without success: quarantined, never dropped."""


class BlockTooLarge(InputRejected):
    """A block of grid points (``points_per_item``) whose work item or shard row would not fit Azure's limits
    (a 64 KiB queue message, a 64 KiB table property): refused at submit, naming the largest block that fits."""


class DecodeError(UpwellError):
    """A message that cannot be decoded; never retried."""


class BudgetExceeded(UpwellError):
    """A job or pool has spent its budget; its work is no longer dispatched."""


class ConfigError(UpwellError):
    """A setting is missing or malformed; the message names the setting."""


class TransientError(UpwellError):
    """Worth retrying: storage hiccups, throttling, a node that went away."""

    permanent = False

    def __init__(self, message: str, *, code: str = "", status: int | None = None):
        super().__init__(message)
        self.code, self.status = code, status


class StorageError(UpwellError):
    """A storage call that retrying will not fix (forbidden, bad request ...); ``code`` says which."""

    def __init__(self, message: str, *, code: str = "", status: int | None = None):
        super().__init__(message)
        self.code, self.status = code, status


class NotFound(StorageError):
    """The blob, queue, message or row is not there."""


class Conflict(StorageError):
    """It exists already, or a condition (ETag, if-none-match) did not hold."""


class IngestLeased(Conflict):
    """Another ingest of the same upload holds the job row's lease and renews it: this one steps back."""


class ShardSourceChanged(UpwellError):
    """A shard that references its data (upwell.shardref) found the original blob changed or gone since
    ingest pinned it: the shard fails at once, and never runs on other bytes. ``source`` is the blob."""

    def __init__(self, message: str, *, source: str = "", code: str = ""):
        super().__init__(message)
        self.message, self.source, self.code = message, source, code


class PoolErrorKind(str, Enum):
    QUOTA = "quota"
    CAPACITY = "capacity"
    AUTH = "auth"
    THROTTLED = "throttled"
    NOT_FOUND = "not_found"
    OTHER = "other"


class PoolError(UpwellError):
    """A worker-pool backend failed. ``kind`` says why; ``retry_after`` is seconds."""

    def __init__(self, message: str, *, kind: PoolErrorKind = PoolErrorKind.OTHER,
                 retry_after: float | None = None):
        super().__init__(message)
        self.kind = kind
        self.retry_after = retry_after
        self.permanent = kind in (PoolErrorKind.QUOTA, PoolErrorKind.AUTH)


class AccessError(UpwellError):
    """A role assignment could not be made, read or removed (``code`` is ARM's error code)."""

    def __init__(self, message: str, *, code: str = "", status: int | None = None):
        super().__init__(message)
        self.code, self.status = code, status


class NotOperator(AccessError):
    """The caller holds no operator role: it may not register payload definitions or pipeline rules."""


class PrincipalInvalid(UpwellError):
    """An ``X-MS-CLIENT-PRINCIPAL`` header that is not base64 JSON of the App Service shape (HTTP 401)."""


class ProjectForbidden(UpwellError):
    """The caller's projects do not include the job's project (HTTP 403)."""

class StackUnreachable(UpwellError):
    """The storage (or functions host) a command needs does not answer: the local stack is not running, or
    is still starting past the bounded wait. The message is one line naming what and how to start it."""

    permanent = False


class DeliveryFailed(UpwellError):
    """A notification could not be delivered (upwell.after.notify): ``status`` the receiver's last HTTP
    status, None when it never answered. Retried with backoff, then recorded on the job, never raised to
    the job's own path."""

    def __init__(self, message: str, *, status: int | None = None):
        super().__init__(message)
        self.status = status
