"""Uploads as a collaborator makes them: files and folders into incoming/, rules into pipelines/.

Inside a folder, data files go up before the manifest, so the manifest never
names a blob that is not there yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from upwell import names
from upwell.ingest.ingestor import MANIFEST_NAMES, check_name, is_manifest, job_id_for
from upwell.storage import Storage

SKIP = {".DS_Store", "Thumbs.db"}


@dataclass(frozen=True)
class Uploaded:
    local: Path
    blob: str  # the name under incoming/
    job_id: str | None  # None for a manifest's inputs


def _files(path: Path, prefix: str) -> list[tuple[Path, str]]:
    if path.is_file():
        return [(path, f"{prefix}{path.name}")]
    if not path.is_dir():
        raise FileNotFoundError(f"{path} does not exist")
    pairs = [(f, f"{prefix}{path.name}/{f.relative_to(path).as_posix()}") for f in sorted(path.rglob("*"))
             if f.is_file() and f.name not in SKIP and not f.name.startswith(".")]
    return sorted(pairs, key=lambda p: (p[1].rsplit("/", 1)[-1] in MANIFEST_NAMES or is_manifest(p[1]), p[1]))


def submit(storage: Storage, paths: list[Path], prefix: str = "") -> list[Uploaded]:
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    out = []
    for path in paths:
        for local, name in _files(Path(path), prefix):
            check_name(name)
            with open(local, "rb") as fh:
                blob = storage.blob(names.INCOMING, name)
                props = blob.upload_blob(fh, overwrite=True, metadata={"uploaded_by": uploader()})
            from upwell.ingest.ingestor import is_manifest_input

            job = None if is_manifest_input(name) and not is_manifest(name) else job_id_for(name, props["etag"])
            out.append(Uploaded(local, name, job))
    return out


def uploader() -> str:
    """Who uploads, for the job's owner when its manifest names none: UPWELL_OWNER, else the login name."""
    import getpass
    import os

    try:
        return os.environ.get("UPWELL_OWNER") or getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def push_rules(storage: Storage, paths: list[Path]) -> list[str]:
    pushed = []
    for path in paths:
        files = [path] if Path(path).is_file() else sorted(Path(path).glob("*.y*ml"))
        for f in files:
            storage.write(f"{names.PIPELINES}/{f.name}", f.read_bytes())
            pushed.append(f.name)
    return pushed
