"""Quarantine: rejected input is copied to quarantine/<name> beside <name>.error.json, then removed.

Nothing is deleted without a copy, and the job is recorded in the ledger as rejected. The error file holds
the exception's fields (``InputRejected.to_dict``: message, field, row, limit, source, and ``rows``: every bad
row found, up to ``UPWELL_QUARANTINE_MAX_ROWS``, with ``more_rows``), the job, the upload's ETag and when.

``listing``, ``error_of`` and ``retry`` are ``upwell quarantine list|show|retry``: a retry uploads the kept copy
(or a fixed file) to its incoming/ name again, a new upload and so a new job, and only once that upload is made
removes the quarantined copy and its error file.
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
             "etag": etag, "rejected_at": now_iso(), "incoming": name if safe == name else ""}
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


def _name(path: str) -> str:
    """A quarantined blob's name from what a user types: with or without ``quarantine/`` or the suffix."""
    name = path.removeprefix(f"{names.QUARANTINE}/").removesuffix(ERROR_SUFFIX)
    if not name or not _printable(name):
        raise InputRejected(f"{path!r} is not a quarantined blob's name", field="path")
    return name


def listing(storage: Storage) -> list[dict]:
    """Every quarantined upload, oldest first: its error file's fields and its name under quarantine/."""
    found = []
    for blob in storage.list(names.QUARANTINE):
        if blob.name.endswith(ERROR_SUFFIX):
            found.append({**error_of(storage, blob.name), "path": blob.name.removesuffix(ERROR_SUFFIX)})
    return sorted(found, key=lambda e: str(e.get("rejected_at") or ""))


def error_of(storage: Storage, path: str) -> dict:
    """The error file of one quarantined upload; NotFound when there is none."""
    raw = storage.read(f"{names.QUARANTINE}/{_name(path)}{ERROR_SUFFIX}")
    try:
        doc = json.loads(raw)
    except ValueError:
        return {"message": f"unreadable error file ({len(raw)} bytes)"}
    return doc if isinstance(doc, dict) else {"message": "unreadable error file"}


def retry(storage: Storage, path: str, data: bytes | None = None) -> tuple[str, str]:
    """Upload the quarantined copy (or ``data``, a fixed file) to incoming/<its name> again, then remove the
    copy and its error file; returns (the incoming name, the new upload's ETag). The rejected job stays."""
    name = _name(path)
    error = error_of(storage, name)
    target = error.get("incoming", name)
    if not target or target.startswith("rejected/"):
        raise InputRejected(f"quarantine/{name} was rejected for its name; upload it again under a valid name",
                            field="path")
    body = data if data is not None else storage.read(f"{names.QUARANTINE}/{name}")
    etag = storage.put(f"{names.INCOMING}/{target}", body)
    for leftover in (name, f"{name}{ERROR_SUFFIX}"):
        try:
            storage.delete(f"{names.QUARANTINE}/{leftover}")
        except NotFound:
            pass
    log.info("quarantine.retried", blob=target)
    return target, etag
