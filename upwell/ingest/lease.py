"""An ingest's lease: an ETag-guarded heartbeat on its job row, renewed while it writes shards and messages.

A stuck ingest is one whose lease has lapsed; the reconciler re-drives only those (upwell.ops.reconcile),
so an ingest that is merely long (a big grid, a slow account, a multi-GB drop) is never driven twice.

Why a heartbeat on the job row and not a blob lease on the upload: both survive a crashed host (a beat
that stops ages; a blob lease lapses), but a blob lease is at most 60 s (or infinite, which a crash never
ends) and blocks every write to the upload that does not carry its id (quarantine's move, a re-upload),
while the job row is what the reconciler already reads (one more selected column, no request more) and
can also say how far the enqueue got, so that a re-drive resumes there.

The lease is three fields of the job row: ``ingest_owner`` (a random token per ingest), ``ingest_beat_at``
(the holder's clock, epoch seconds; 0 once released) and ``ingest_sent`` (how many work items, in shard
order, had all gone out at the last beat). Every write goes through ``Ledger.change_job``, conditional on
the row's ETag, and only while this ingest is still the owner: one whose lease lapsed and was taken over
learns it at its next beat (IngestLeased) and stops. Holder and reconciler read different clocks; NTP
keeps them within a second or two, small beside ``ingest_lease_s`` (30 s by default, renewed every sixth).

Followed: the Blob service's "Lease Blob" operation (a lock "for write and delete operations", 15 to 60 s
or infinite) for the choice above, and the Table service's "Update Entity"/"Merge Entity" with ``If-Match``
(a write that fails with 412 when the entity changed since it was read), through ``Ledger.change_job``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from upwell import logs
from upwell.errors import IngestLeased
from upwell.ledger import JobRow, JobState, Ledger

log = logs.get("upwell.ingest.lease")
OPEN = (JobState.INGESTING, JobState.WAITING)  # a row an ingest may take: not yet accepted


def live(job: JobRow, now: float, lease_s: float) -> bool:
    """True while some ingest holds ``job``'s lease: its last beat is younger than ``lease_s``."""
    return job.ingest_beat_at > 0 and now - job.ingest_beat_at < lease_s


class IngestLease:
    """One ingest's hold on its job row. ``sent``: the work items known to have gone out (the resume point
    of the row taken over, then this ingest's own progress)."""

    def __init__(self, ledger: Ledger, job_id: str, lease_s: float, clock: Callable[[], float] = time.time):
        self.ledger, self.job_id, self.lease_s, self.clock = ledger, job_id, float(lease_s), clock
        self.owner = uuid.uuid4().hex
        self.every = self.lease_s / 6
        self.last = 0.0
        self.sent = 0

    def fields(self) -> dict[str, Any]:
        """The lease's fields for a job row this ingest creates."""
        self.last = self.clock()
        return {"ingest_owner": self.owner, "ingest_beat_at": self.last, "ingest_sent": 0}

    def take(self, merged: dict[str, Any]) -> JobRow | None:
        """Take the lease of a job row that exists (an earlier delivery's, or the wait for data's) and merge
        ``merged`` into it, in one conditional write. Returns the row as it was (``sent`` becomes its
        ``ingest_sent``), or None when the job has moved on (accepted, ended). Raises IngestLeased while
        another ingest's lease is live."""
        held: list[JobRow] = []

        def change(row: JobRow) -> dict[str, Any] | None:
            if row.status not in OPEN:
                return None
            now = self.clock()
            if row.ingest_owner != self.owner and live(row, now, self.lease_s):
                raise IngestLeased(f"job {self.job_id}: another ingest holds its lease (beat "
                                   f"{now - row.ingest_beat_at:.1f} s ago)", code="IngestLeased")
            held[:] = [row]
            self.last = now
            return {**merged, "ingest_owner": self.owner, "ingest_beat_at": now, "ingest_sent": row.ingest_sent}

        if self.ledger.change_job(self.job_id, change) is None:
            return None
        self.sent = held[0].ingest_sent
        return held[0]

    def renew(self, sent: int) -> None:
        """Note that the first ``sent`` work items have gone out; once a sixth of the lease has passed
        since the last beat, beat (and record them). Raises IngestLeased when the lease was taken over."""
        self.sent = max(self.sent, sent)
        now = self.clock()
        if now - self.last < self.every:
            return

        def change(row: JobRow) -> dict[str, Any] | None:
            self._still_mine(row)
            return {"ingest_beat_at": now, "ingest_sent": max(row.ingest_sent, self.sent)}

        self.ledger.change_job(self.job_id, change)
        self.last = now

    def finish(self, **fields: Any) -> bool:
        """ingesting (or waiting) -> accepted with ``fields``, and the lease released, in one conditional
        write. A job that ended meanwhile (its shards all counted before this write) keeps its end: only the
        lease is released. False then."""
        moved: list[bool] = []

        def change(row: JobRow) -> dict[str, Any] | None:
            self._still_mine(row)
            done = {"ingest_beat_at": 0.0, "ingest_sent": max(row.ingest_sent, self.sent)}
            moved[:] = [row.status in OPEN]
            return {**fields, "status": JobState.ACCEPTED, **done} if moved[0] else done

        self.ledger.change_job(self.job_id, change)
        return bool(moved and moved[0])

    def release(self) -> None:
        """Give the lease up after an error, so that the host's next delivery need not wait for it to lapse
        (a crash never gets here: then it lapses). Never raises: a lease left behind lapses by itself."""
        def change(row: JobRow) -> dict[str, Any] | None:
            return {"ingest_beat_at": 0.0} if row.ingest_owner == self.owner and row.ingest_beat_at else None

        try:
            self.ledger.change_job(self.job_id, change)
        except Exception as exc:  # noqa: BLE001 - the lease lapses by itself; the original error matters
            log.warning("ingest.lease_release_failed", job_id=self.job_id, error=str(exc)[:300])

    def _still_mine(self, row: JobRow) -> None:
        if row.ingest_owner != self.owner:
            raise IngestLeased(f"job {self.job_id}: the ingest's lease lapsed and another ingest took it over",
                               code="IngestLeased")
