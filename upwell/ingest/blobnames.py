"""What an incoming blob's name allows and means: the name checks, the job id, manifests and their inputs.

Pure functions of the name (and the ETag for the job id); nothing here reads storage.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

from upwell.errors import InputRejected

MAX_NAME = 1024
MANIFEST_NAMES = ("job.yaml", "job.yml", "job.json")
INPUT_FOLDER = "data"  # incoming/<x>/data/... are a manifest's inputs, never jobs themselves
# Archives and compressed files are refused by name (and by content in manifests and sharding):
# upwell shards what it can see, and an archive would hide the files, their sizes and names.
ARCHIVE_SUFFIXES = (".zip", ".tar", ".tgz", ".tar.gz", ".gz", ".bz2", ".tbz2", ".xz", ".txz", ".7z", ".rar",
                    ".zst", ".lz4", ".lzma", ".z", ".jar", ".whl")


def check_name(name: str) -> None:
    """Refuse path names with '..', absolute paths, control characters or excessive length."""
    if len(name) > MAX_NAME:
        raise InputRejected(f"blob name is {len(name)} characters; the limit is {MAX_NAME}", field="name",
                            limit=f"max_name={MAX_NAME}")
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:[\\/]", name):
        raise InputRejected(f"blob name {name[:80]!r} is an absolute path", field="name")
    if any(part == ".." for part in re.split(r"[\\/]", name)):
        raise InputRejected(f"blob name {name[:80]!r} contains '..'", field="name")
    if any(part == "." for part in re.split(r"[\\/]", name)):
        raise InputRejected(f"blob name {name[:80]!r} contains a '.' path segment", field="name")
    if any(unicodedata.category(c) == "Cc" for c in name):
        raise InputRejected(f"blob name {name[:80]!r} contains control characters", field="name")
    if name.lower().endswith(ARCHIVE_SUFFIXES):
        raise InputRejected(f"{name.rsplit('/', 1)[-1][:80]!r} is an archive; archives are not accepted: upload the "
                            "files themselves (uncompressed)", field="name")


def job_id_for(name: str, etag: str) -> str:
    """Deterministic: '<slug of the name>-<12 hex of sha256(name, etag)>'."""
    digest = hashlib.sha256(f"{name}\n{etag}".encode()).hexdigest()[:12]
    stem = name.rsplit("/", 2)
    label = stem[-2] if stem[-1] in MANIFEST_NAMES and len(stem) > 1 else stem[-1].rsplit(".", 1)[0]
    slug = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")[:40] or "job"
    return f"{slug}-{digest}"


def is_manifest(name: str) -> bool:
    """Whether ``name`` is a job manifest (job.yaml / job.yml / job.json, or <x>.job.yaml and the like)."""
    base = name.rsplit("/", 1)[-1]
    return base in MANIFEST_NAMES or base.endswith((".job.yaml", ".job.yml", ".job.json"))


def is_manifest_input(name: str) -> bool:
    """Whether ``name`` lies in a data/ folder: a manifest's input, never a job of its own."""
    return f"/{INPUT_FOLDER}/" in f"/{name}"


def instrument_drop(name: str) -> bool:
    """Whether ``name`` can only be an instrument drop (a pipeline rule decides what it is)."""
    try:
        check_name(name)
    except InputRejected:
        return False
    return not is_manifest(name) and not is_manifest_input(name)
