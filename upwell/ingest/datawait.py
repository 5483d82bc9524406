"""A manifest that came before its data: the job waits, then goes on, or is rejected once its grace is over.

Storage Explorer drops a folder in no set order, so a manifest may name data blobs that are not in yet.
Its job row stays "waiting"; each arrival of a data blob, and the timer, ingest the manifest again.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

from upwell import names
from upwell.errors import InputRejected
from upwell.ingest import manifests
from upwell.ingest.blobnames import INPUT_FOLDER, check_name, is_manifest, job_id_for
from upwell.ledger import JobRow, JobState, Ledger
from upwell.settings import Settings
from upwell.storage import Storage


def data_path(manifest_name: str, ref: str) -> str:
    """The blob a manifest's data ref names: beside the manifest, unless it names incoming/ itself."""
    folder = manifest_name.rsplit("/", 1)[0] if "/" in manifest_name else ""
    return ref if ref.startswith(f"{names.INCOMING}/") else f"{names.INCOMING}/{folder}/{ref}".replace("//", "/")


def data_exists(storage: Storage, manifest_name: str, ref: str) -> bool:
    """Whether the data ref is in storage; a wrongly named ref counts as present (waiting would not help)."""
    try:
        check_name(ref)
    except InputRejected:
        return True  # named wrongly: sharding rejects it with the field; waiting would not help
    return storage.exists(data_path(manifest_name, ref))


def wait_for_data(ledger: Ledger, settings: Settings, job: dict, props, m: manifests.Manifest,
                  missing: list[str], bound) -> str:
    """Keep the job "waiting" until its data blobs are in, for data_wait_s after the upload; returns the
    job's message. Past the grace, raises InputRejected naming the first missing ref."""
    waited = (datetime.now(UTC) - props.last_modified).total_seconds() if props.last_modified else 0.0
    grace = settings.data_wait_s
    shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
    if waited >= grace:
        i = m.data.index(missing[0])
        where = data_path(job["source_blob"][len(names.INCOMING) + 1:], missing[0])
        raise InputRejected(f"data blob {where} does not exist (missing: {shown}; waited {waited:.0f} s, "
                            f"the limit is {grace} s)", field=f"data[{i}]", limit=f"data_wait_s={grace}")
    until = (props.last_modified + timedelta(seconds=grace)).isoformat(timespec="seconds").replace("+00:00", "Z")
    message = (f"waiting for data blobs: {shown} ({len(m.data) - len(missing)} of {len(m.data)} present); "
               f"gives up at {until}")
    row = {**job, "status": JobState.WAITING.value, "message": message, "wait_until": until, "shards_total": 0}
    _, created = ledger.create_job(JobRow.from_entity(row))
    if not created:
        ledger.update_job(job["job_id"], message=message, wait_until=until)
    bound.info("ingest.waiting_for_data", missing=len(missing), until=until)
    return message


def waiting_manifests(storage: Storage, ledger: Ledger, data_name: str) -> Iterator[str]:
    """The waiting manifests in the folder that holds ``data_name``'s data/, one at a time as the listing
    goes (the caller ingests each before the next is looked at)."""
    folder = f"/{data_name}".rsplit(f"/{INPUT_FOLDER}/", 1)[0].lstrip("/")
    prefix = f"{folder}/" if folder else ""
    for blob in storage.list(names.INCOMING, prefix):
        rest = blob.name[len(prefix):]
        if "/" in rest or not is_manifest(blob.name):
            continue
        etag = blob.etag if str(blob.etag).startswith('"') else f'"{blob.etag}"'
        found = ledger.job(job_id_for(blob.name, etag))
        if found is not None and found.status == JobState.WAITING:
            yield blob.name
