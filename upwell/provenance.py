"""What is recorded with every result so that it can be reproduced.

The image digest is the definition's pin, except for the built-in definitions' all-zero placeholder: they
run in the deployment's own worker image, whatever digest it was built as, so the result records the
node's ``UPWELL_IMAGE_DIGEST`` (``bicep/hooks/imagedigest.sh`` pins the pools' images by digest at deploy
and the pools pass it to their agents; ``local`` on this machine). A tool's version is the line of its
definition's ``version_command`` output that gives the version (``tool_version``).
"""

from __future__ import annotations

import functools
import hashlib
import platform
import re
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


ZERO_DIGEST = "sha256:" + "0" * 64  # the built-in definitions' placeholder pin


def image_digest(pinned: str, node: str) -> str:
    """The digest a result records: the definition's ``pinned`` one, unless it is missing or the all-zero
    placeholder; then the node's own (``node``: UPWELL_IMAGE_DIGEST)."""
    return node if not pinned or pinned == ZERO_DIGEST else pinned


VERSION_LINE = re.compile(r"\bversion\b\s*[:=]?\s*v?\d", re.IGNORECASE)  # "GROMACS version:  2022.5"


def tool_version(output: str, limit: int = 200) -> str:
    """The line of a version command's output that gives the version: the first where "version" is followed
    by a number (not an echoed "gmx --version"), else the first with a digit, else the first that is not
    blank; stripped and cut to ``limit`` characters; '' for none."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    named = [line for line in lines if VERSION_LINE.search(line)]
    numbered = [line for line in lines if any(c.isdigit() for c in line)]
    return (named or numbered or lines or [""])[0][:limit]
