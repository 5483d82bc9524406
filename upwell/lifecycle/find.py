"""Find a job by what a user has in hand: its id, a unique id prefix, its name, or the path it was uploaded to.

A path or name that several uploads share (the same folder submitted twice) means the newest of them;
``find_job`` says so through ``Found.note``.
"""

from __future__ import annotations

from dataclasses import dataclass

from upwell import names
from upwell.errors import UpwellError
from upwell.ingest.blobnames import MANIFEST_NAMES, job_id_for
from upwell.ledger import JobRow, Ledger
from upwell.storage import Storage


class NoSuchJob(UpwellError):
    """No job matches what the user typed."""


@dataclass(frozen=True)
class Found:
    job_id: str
    row: JobRow
    note: str = ""  # e.g. "newest of 3 jobs uploaded to demo/logistic"


def _paths(text: str) -> set[str]:
    """The source_blob values an upload path can mean: the blob itself or a manifest in that folder."""
    path = text.strip().strip("/")
    if path.startswith(f"{names.INCOMING}/"):
        path = path[len(names.INCOMING) + 1:]
    return {f"{names.INCOMING}/{path}"} | {f"{names.INCOMING}/{path}/{m}" for m in MANIFEST_NAMES}


def find_job(storage: Storage, text: str, ledger: Ledger | None = None) -> Found:
    """Resolve ``text`` (an id, a unique id prefix, a job name or an upload path) to one job."""
    ledger = ledger or Ledger(storage)
    text = (text or "").strip()
    if not text:
        raise NoSuchJob("no job given")
    # Table keys cannot hold / \\ # ?: such text is a path or a name, never an id.
    row = ledger.job(text) if not any(c in text for c in "/\\#?") else None
    if row is not None:
        return Found(text, row)
    # one query of the job catalogue (upwell.jobcatalog): the ids with this prefix, the jobs of this name or
    # upload path; then a point read of the one job found
    listed = ledger.catalog.lookup(text, text, _paths(text))
    by_prefix = [r for r in listed if r.job_id.startswith(text)]
    if len(by_prefix) > 1:
        ids = ", ".join(sorted(r.job_id for r in by_prefix)[:10])
        raise NoSuchJob(f"{text!r} is the start of {len(by_prefix)} job ids ({ids}); give more of it")
    paths = _paths(text)
    matches = by_prefix or sorted((r for r in listed if r.source_blob in paths or r.name == text),
                                  key=lambda r: r.created_at, reverse=True)
    found = next(ledger.listed(matches), None)
    if found is None:
        raise NoSuchJob(f"no such job: {text!r} is not a job id, job name or upload path "
                        "(`upwell status` lists the jobs)")
    others = [r.job_id for r in matches if r.job_id != found.job_id]
    note = f"newest of {len(matches)} jobs for {text!r}; the others: " + ", ".join(others[:4]) if others else ""
    return Found(found.job_id, found, note)


def pending_upload(storage: Storage, job_id: str) -> str | None:
    """The incoming/ blob whose ingest will create ``job_id`` (uploaded, not yet ingested), if any."""
    for blob in storage.list(names.INCOMING):
        etag = blob.etag if blob.etag.startswith('"') else f'"{blob.etag}"'  # listings drop the quotes
        if job_id_for(blob.name, etag) == job_id:
            return f"{names.INCOMING}/{blob.name}"
    return None


def pending_path(storage: Storage, text: str) -> str | None:
    """The job id that the upload at path ``text`` (a blob under incoming/, or a folder holding a manifest) will
    create once it is ingested, if that upload is there; a command typed right after `upwell submit` waits for it."""
    from azure.core.exceptions import ResourceNotFoundError

    for path in sorted(_paths(text)):
        name = path[len(names.INCOMING) + 1:]
        try:
            etag = storage.blob(names.INCOMING, name).get_blob_properties().etag
        except ResourceNotFoundError:
            continue
        return job_id_for(name, etag if etag.startswith('"') else f'"{etag}"')
    return None
