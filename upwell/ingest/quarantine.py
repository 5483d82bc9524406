"""Quarantine: rejected input is copied to quarantine/<name> beside <name>.error.json, then removed.

Nothing is deleted without a copy, and the job is recorded in the ledger as rejected.
"""

from __future__ import annotations

import json
import unicodedata

from upwell import logs, names
from upwell.errors import InputRejected, NotFound, UpwellError
from upwell.ingest.blobnames import MAX_NAME
from upwell.ledger import JobRow, JobState, Ledger
from upwell.storage import Storage, dot_segments
from upwell.timeutil import now_iso

ERROR_SUFFIX = ".error.json"

log = logs.get("upwell.ingest.quarantine")


def quarantine(storage: Storage, ledger: Ledger, job_id: str, name: str, etag: str, exc: InputRejected) -> None:
    """Copy the upload to quarantine/<name> beside <name>.error.json, then remove the original."""
    fits = len(name) + len(ERROR_SUFFIX) <= MAX_NAME
    safe = name if _printable(name) and fits else f"rejected/{job_id}"
    error = {**exc.to_dict(), "job_id": job_id, "blob": f"{names.INCOMING}/{name!r}"[:2000],
             "etag": etag, "rejected_at": now_iso()}
    src = f"{names.INCOMING}/{name}"
    try:
        storage.write(f"{names.QUARANTINE}/{safe}", storage.chunks(src, etag=etag),
                      metadata={"source_etag": etag.strip('"')})
    except NotFound:
        pass  # already moved by an earlier delivery
    storage.write(f"{names.QUARANTINE}/{safe}{ERROR_SUFFIX}", json.dumps(error, indent=2).encode(),
                  content_type="application/json")
    ledger.create_job(JobRow(job_id=job_id, name=name[:200], status=JobState.REJECTED, message=exc.message,
                             error_field=exc.field, error_row=exc.row, source_blob=f"incoming/{name}"[:1000],
                             quarantine_blob=f"{names.QUARANTINE}/{safe}", created_at=now_iso()))
    # a row that was there (the ingest writes the job row first) takes the rejection's fields too
    where = {"error_row": exc.row} if exc.row is not None else {}
    ledger.update_job(job_id, status=JobState.REJECTED, message=exc.message, error_field=exc.field, **where,
                      quarantine_blob=f"{names.QUARANTINE}/{safe}")
    try:
        storage.delete(src, etag=etag)
    except UpwellError as err:  # the ETag no longer matches (a newer upload under the same name stays), it
        # is gone, or storage failed: the copy is made and the job rejected; the original may stay.
        log.info("ingest.quarantine_kept_original", reason=type(err).__name__)


def _printable(name: str) -> bool:
    return not any(unicodedata.category(c) == "Cc" for c in name) and not dot_segments(name) \
        and not name.startswith("/")
