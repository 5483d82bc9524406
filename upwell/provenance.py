"""What is recorded with every result so that it can be reproduced."""

from __future__ import annotations

import functools
import hashlib
import platform
import subprocess
from importlib import metadata
from pathlib import Path

from upwell import REPO

PACKAGES = ("upwell", "numpy", "scipy", "torch", "mpi4py", "scikit-learn", "pyarrow", "azure-storage-blob",
            "azure-storage-queue", "azure-data-tables", "azure-functions")
REPO = REPO


@functools.cache
def code_version() -> str:
    """`git describe` of the checkout (with -dirty), or the package version outside git."""
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--tags"], cwd=REPO, capture_output=True,
                             text=True, timeout=5, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        from upwell import __version__

        return __version__


@functools.cache
def packages() -> dict[str, str]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def python() -> str:
    return f"{platform.python_implementation()} {platform.python_version()}"


def sha256_file(path: Path) -> str:
    """The sha256 of a file; of a folder input (a reduce's results), the sha256 over its files' relative
    paths and their own sha256s, in path order."""
    h = hashlib.sha256()
    if Path(path).is_dir():
        for f in sorted(p for p in Path(path).rglob("*") if p.is_file()):
            h.update(f"{f.relative_to(path).as_posix()}\0{sha256_file(f)}\n".encode())
        return h.hexdigest()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
