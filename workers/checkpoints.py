"""A definition's checkpoint in the work dir: what counts, what is kept, and when it is dropped.

Only files matching ``checkpoint.files`` are the checkpoint. ``checkpoint.keep`` files travel with them
(a log the tool appends to on resume) but never make an attempt a resume; anything else an earlier attempt
left (a tool's own log in ``{ckpt}``) is neither restored nor uploaded. Between attempts the kept files are
stored by their path relative to the work dir W: ``prepare_workdir`` puts them under ``W/ckpt/``, ``restore``
moves them back to their places, ``keep`` links the newest ones (``checkpoint.history`` per glob) into
``W/.upwell-kept/``, which the agent uploads (``workers.staging.Staging.checkpoint_out``). An empty
checkpoint file is a truncated one: the whole checkpoint is dropped and the attempt starts fresh, saying why.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from upwell.payloads.definition import Definition

KEPT_DIR = ".upwell-kept"  # the folder whose files are uploaded as the shard's checkpoint
_MOVING = ".upwell-restore"


@dataclass
class Restored:
    """The checkpoint an attempt starts from: each checkpoint file's (size, mtime_ns) by its path in W,
    empty for a fresh start; ``note`` says why a checkpoint that was there is not used."""

    files: dict[str, tuple[int, int]] = field(default_factory=dict)
    note: str = ""

    @property
    def resumed(self) -> bool:
        return bool(self.files)


def matches(workdir: Path, patterns: list[str]) -> list[Path]:
    """Regular files in ``workdir`` (not links, not leaving it) that match any glob, in the globs' order."""
    found: dict[Path, None] = {}
    for pattern in patterns:
        for name in sorted(glob.glob(pattern, root_dir=workdir, recursive=True)):
            path = workdir / name
            if path.is_file() and not path.is_symlink() and path.resolve().is_relative_to(workdir):
                found[path] = None
    return list(found)


def declared(d: Definition, rel: str) -> str:
    """'files' (the checkpoint), 'keep' (kept beside it) or '' (neither) for a path relative to W."""
    if any(fnmatch.fnmatchcase(rel, g) for g in d.checkpoint.files):
        return "files"
    return "keep" if any(fnmatch.fnmatchcase(rel, g) for g in d.checkpoint.keep) else ""


def fingerprint(d: Definition, workdir: Path) -> dict[str, tuple[int, int]]:
    """The non-empty checkpoint files now in W: path -> (size, mtime_ns); an empty one is no checkpoint."""
    out = {}
    for path in matches(workdir, d.checkpoint.files):
        st = path.stat()
        if st.st_size:
            out[path.relative_to(workdir).as_posix()] = (st.st_size, st.st_mtime_ns)
    return out


def restore(d: Definition, workdir: Path) -> Restored:
    """Move the kept files staged in ``W/ckpt/`` back to their places; undeclared ones are dropped. An empty
    checkpoint file drops the whole checkpoint (a fresh start, with the note)."""
    staged, moving = workdir / "ckpt", workdir / _MOVING
    if not any(p.is_file() for p in staged.rglob("*")):
        return Restored()
    os.replace(staged, moving)
    staged.mkdir()
    empty = ""
    for path in sorted(p for p in moving.rglob("*") if p.is_file() and not p.is_symlink()):
        rel = path.relative_to(moving).as_posix()
        kind = declared(d, rel)
        if kind == "files" and path.stat().st_size == 0:
            empty = empty or rel
        if kind:
            (workdir / rel).parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, workdir / rel)
    shutil.rmtree(moving, ignore_errors=True)
    if empty:
        discard(d, workdir)
        return Restored(note=f"checkpoint file {empty} was empty (truncated): started fresh")
    return Restored(fingerprint(d, workdir))


def discard(d: Definition, workdir: Path) -> None:
    """Remove the checkpoint and the files kept beside it, so that the tool starts fresh."""
    for path in matches(workdir, [*d.checkpoint.files, *d.checkpoint.keep]):
        path.unlink(missing_ok=True)


def keep(d: Definition, workdir: Path) -> tuple[Path, int]:
    """Link the files to keep into ``W/.upwell-kept/`` (by their path in W): of each checkpoint glob its
    newest ``history`` non-empty matches, and every ``keep`` match; (that folder, checkpoint files in it)."""
    kept = workdir / KEPT_DIR
    shutil.rmtree(kept, ignore_errors=True)
    kept.mkdir()
    chosen: dict[Path, None] = {}
    for pattern in d.checkpoint.files:
        found = [p for p in matches(workdir, [pattern]) if not p.is_relative_to(kept) and p.stat().st_size]
        found.sort(key=lambda p: (p.stat().st_mtime_ns, p.name))
        chosen.update(dict.fromkeys(found[-d.checkpoint.history:]))
    n = len(chosen)
    chosen.update(dict.fromkeys(p for p in matches(workdir, d.checkpoint.keep) if not p.is_relative_to(kept)))
    for path in chosen:
        dest = kept / path.relative_to(workdir)
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, dest)  # no copy of a large restart file; the upload reads it once
        except OSError:
            shutil.copy2(path, dest)
    return kept, n
