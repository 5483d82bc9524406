"""Staging: an attempt's files between storage and the node's scratch folder.

In: the shard's input blob (or a folder of them: a reduce's results, ``stage_folder``; or, for a shard that
references its data, its byte range of the pinned original with the header before it, or its row groups of
a pinned Parquet original as CSV: ``upwell.shardref``),
and the kept checkpoint files (``checkpoints/<job>/<shard>/``) when one may exist (``may_resume``). Out: the
checkpoint an attempt left when it may be resumed (preempted or cancelled; only what changed is sent, and only
the newest is kept), the artifacts of a success, and ``payload.log`` of every attempt that printed something
(``keep_log``). Nothing a payload names
leaves its work dir, and every name is made one harmless segment (``safe_name``), so a hostile output or
checkpoint name cannot write outside the shard's prefix.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import re
import shutil
import tempfile
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from upwell import names
from upwell.blobfile import BlobFile
from upwell.errors import Conflict, NotFound, ShardSourceChanged, UpwellError
from upwell.messages import WorkItem
from upwell.results.points import expand_result
from upwell.rows import ShardRow
from upwell.shardref import ShardRef, normalize, row_groups_csv
from upwell.storage import Storage

_UNSAFE = re.compile(r"[^A-Za-z0-9._+=@-]")


class Staging:
    """State: the storage account, the scratch folder (created if missing: a node without it must not fail,
    and poison, every shard), and the agent's log."""

    def __init__(self, storage: Storage, scratch: str, log: Any) -> None:
        self.storage, self.scratch, self.log = storage, scratch, log
        if scratch:
            Path(scratch).mkdir(parents=True, exist_ok=True)

    @contextmanager
    def workdir(self, shard_id: str) -> Iterator[Path]:
        """A fresh folder for one attempt in the scratch folder, removed afterwards whatever happened."""
        root = Path(tempfile.mkdtemp(prefix=f"upwell-{safe_name(shard_id)[:40]}-", dir=self.scratch or None))
        try:
            yield root
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def stage_in(self, item: WorkItem, root: Path) -> Path | None:
        """The shard's input blob under root/input/; None when the item has none."""
        if not item.input_blob:
            return None
        if item.input_blob.endswith("/"):
            return self.stage_folder(item, root / "input")
        ref = ShardRef.from_dict(item.input_range) if item.input_range else None
        # a Parquet shard is staged as CSV, under the name its copy had (shards/<job>/<shard>.csv)
        name = f"{safe_name(item.shard_id)}.csv" if ref and ref.row_groups else Path(item.input_blob).name
        dest = root / "input" / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(dest, "wb") as fh:
            if ref:
                self._ranged(item, ref, fh)
            else:
                self.storage.download(item.input_blob, fh)
        return dest

    def stage_folder(self, item: WorkItem, dest: Path) -> Path:
        """A folder input (a reduce's ``results/<job>/``) into ``dest``: every ``<shard>.json`` directly under
        the prefix, and each ``<shard>/<artifact>`` whose name matches one of ``item.input_select``."""
        container, prefix = item.input_blob.split("/", 1)
        dest.mkdir(parents=True, exist_ok=True)
        for b in self.storage.list(container, prefix):
            parts = b.name[len(prefix):].split("/")
            wanted = (len(parts) == 1 and parts[0].endswith(".json")) or \
                (len(parts) == 2 and any(fnmatch.fnmatchcase(parts[1], g) for g in item.input_select))
            path = _inside(dest, "/".join(parts)) if wanted else None
            if path is None:
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as fh:
                self.storage.download(f"{container}/{b.name}", fh)
            if len(parts) == 1:
                as_points(path, dest)
        return dest

    def _ranged(self, item: WorkItem, ref: ShardRef, fh) -> None:
        """A shard that references its data (upwell.shardref): the range of the pinned version, header first,
        or its row groups of a Parquet original as CSV (only the footer and those row groups are read, each
        read a ranged GET of the pinned version: upwell.blobfile). ShardSourceChanged when the original changed
        (412) or is gone (404): never a run on other bytes."""
        span = (ref.offset, ref.length) if ref.length else (None, None)
        try:
            if ref.row_groups:
                row_groups_csv(BlobFile(self.storage, item.input_blob, size=ref.length, etag=ref.etag,
                                        version_id=ref.version_id), ref, fh)
                return
            chunks = self.storage.chunks(item.input_blob, etag=ref.etag, offset=span[0], length=span[1],
                                         version_id=ref.version_id or None)
            for piece in normalize(chunks, ref):
                fh.write(piece)
        except (Conflict, NotFound) as exc:
            # If-Match on a deleted blob may answer 412 as well as 404: ask which it is, for the message
            gone = isinstance(exc, NotFound) or not self.storage.exists(item.input_blob)
            how = "is gone" if gone else "was overwritten"
            pinned = f"version {ref.version_id}" if ref.version_id else f"ETag {ref.etag}"
            raise ShardSourceChanged(f"the shard's input {item.input_blob} {how} since ingest pinned it "
                                     f"({pinned}); the shard reads {ref.span} of that version only, so it does "
                                     "not run", source=item.input_blob,
                                     code=exc.code) from None

    def checkpoint_in(self, item: WorkItem, root: Path) -> Path | None:
        """The kept checkpoint files under root/resume/; None when there are none. A blob name that would
        land outside the folder is refused and logged."""
        prefix = item.checkpoint_prefix.split("/", 1)[1]
        blobs = list(self.storage.list(names.CHECKPOINTS, prefix))
        if not blobs:
            return None
        dest = root / "resume"
        for b in blobs:
            path = _inside(dest, b.name[len(prefix):])
            if path is None:
                self.log.warning("agent.checkpoint_name_refused", blob=f"{names.CHECKPOINTS}/{b.name}"[:300])
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as fh:
                self.storage.download(f"{names.CHECKPOINTS}/{b.name}", fh)
        return dest

    def checkpoint_out(self, item: WorkItem, ckpt: Path | None) -> int:
        """Make the shard's stored checkpoint the regular files of ``ckpt`` (not ``*.tmp``, a write in
        progress): upload each whose content differs from the stored blob's (the sha256 in its metadata),
        then delete the stored blobs ``ckpt`` no longer has (an older restart file), so only the newest
        checkpoint is kept and an unchanged file is never sent twice. Nothing is deleted before the new files
        are up, and an attempt that left no files leaves the stored checkpoint alone. How many files it has."""
        if not ckpt or not Path(ckpt).is_dir():
            return 0
        files = {"/".join(safe_name(part) for part in path.relative_to(ckpt).parts): path
                 for path in sorted(Path(ckpt).rglob("*")) if _regular(path, ckpt) and not path.name.endswith(".tmp")}
        if not files:
            return 0
        prefix = item.checkpoint_prefix.split("/", 1)[1]
        stored = {b.name[len(prefix):]: (b.metadata or {}).get("sha256", "")
                  for b in self.storage.list(names.CHECKPOINTS, prefix, metadata=True)}
        uploaded = 0
        for rel, path in files.items():
            digest = _sha256(path)
            if stored.pop(rel, None) == digest:
                continue
            with open(path, "rb") as fh:
                self.storage.for_project(item.project).write(f"{item.checkpoint_prefix}{rel}", fh,
                                                               metadata={"sha256": digest})
            uploaded += 1
        for rel in stored:
            with contextlib.suppress(NotFound):  # gone already (a duplicate attempt's cleanup)
                self.storage.delete(f"{item.checkpoint_prefix}{rel}")
        self.log.info("agent.checkpoint_out", files=len(files), uploaded=uploaded, deleted=len(stored))
        return len(files)

    def save_file(self, item: WorkItem, path: Path) -> None:
        """One file of the shard's checkpoint (a block's state between its points, workers.blocks), stored as
        ``checkpoint_out`` stores it: its sha256 in the metadata, so the next ``checkpoint_out`` skips it
        unless it changed. One blob write."""
        with open(path, "rb") as fh:
            self.storage.for_project(item.project).write(f"{item.checkpoint_prefix}{safe_name(Path(path).name)}", fh,
                                                           metadata={"sha256": _sha256(Path(path))})

    def stage_out(self, item: WorkItem, artifacts, out_dir: Path) -> dict[str, str]:
        """Upload each artifact that is a regular file inside ``out_dir``; name -> blob."""
        out = {}
        for path in artifacts:
            if not _regular(Path(path), out_dir):
                self.log.warning("agent.artifact_refused", artifact=str(path)[:300], reason="not a regular file")
                continue
            name = safe_name(Path(path).name)
            blob = f"{item.result_prefix}/{name}"
            with open(path, "rb") as fh:
                self.storage.for_project(item.project).write(blob, fh)
            out[name] = blob
        return out

    def keep_log(self, item: WorkItem, result, *, earlier: bool) -> None:
        """payload.log is kept for every attempt whose payload printed something (results/<job>/<shard>/
        payload.log, the latest such attempt's): on success it goes up with the outputs, otherwise here. An
        attempt whose payload printed nothing (``result.log_bytes`` 0: only upwell's command lines are in its
        log) uploads nothing, the common case of a small sweep point; the result records ``log_bytes`` and a
        reader takes a missing log for an empty one. So that an earlier attempt's log is not left looking like
        this one's, it is deleted then, but only when the shard row shows an earlier attempt (``earlier``,
        facts already in hand): a first attempt pays no request for a log it never had."""
        path = getattr(result, "log_path", None)
        if not path or not Path(path).is_file():
            return  # the payload never started: the latest log is still the last one that ran
        blob = f"{item.result_prefix}/payload.log"
        out_dir = Path(result.checkpoint_dir).parent / "out"
        try:
            if _silent(result, Path(path)):
                if earlier:
                    with contextlib.suppress(NotFound):  # no earlier attempt printed anything either
                        self.storage.delete(blob)
                return
            if result.status == "succeeded" and out_dir.is_dir():
                shutil.copyfile(path, out_dir / "payload.log")
                result.artifacts.append(out_dir / "payload.log")
                return
            with open(path, "rb") as fh:
                self.storage.for_project(item.project).write(blob, fh)
        except UpwellError as exc:
            self.log.warning("agent.log_not_kept", error=str(exc).splitlines()[0][:200], code=exc.code)


def _silent(result, path: Path) -> bool:
    """Did the attempt's payload print nothing? Its counted output (``LaunchResult.log_bytes``), or where that
    was not counted, an empty file."""
    counted = getattr(result, "log_bytes", None)
    return counted == 0 if counted is not None else path.stat().st_size == 0


def as_points(path: Path, dest: Path) -> None:
    """A block's result (workers.blocks) staged for a reduce as its points' results, ``<shard>.p<j>.json``, so a
    reduce reads a sweep in blocks as it reads one of a point per shard (upwell.results.points); any other
    result is left as it is."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    docs = expand_result(doc) if isinstance(doc, dict) else [doc]
    if len(docs) == 1 and docs[0] is doc:
        return
    for one in docs:
        target = _inside(dest, safe_name(f"{one['shard_id']}.json"))
        if target is not None:
            target.write_text(json.dumps(one, default=str))
    path.unlink()


def may_resume(row: ShardRow, etag: str) -> bool:
    """Could a checkpoint exist for this shard? Not when its row, as read before this agent marked it
    running (and unchanged since: the mark went through on its ETag, ``etag``), shows no earlier attempt,
    no preemption and no kept checkpoint: checkpoints are only ever uploaded by an attempt, which first
    marks the row. A first delivery so skips the checkpoint listing, one storage call of about a dozen."""
    return not etag or bool(row.attempts or row.preemptions or row.checkpoints)


def safe_name(name: str, limit: int = 200) -> str:
    """One path segment that is safe as a local file name and a blob name segment: no separators,
    no control characters, not '.' or '..' (a backslash would become '/' in a blob name)."""
    safe = _UNSAFE.sub("_", name)[:limit]
    return safe if safe.strip(".") else safe.replace(".", "_") or "_"


def _inside(root: Path, rel: str) -> Path | None:
    """root/rel when it stays inside root (no '..', no absolute part, no backslash tricks), else None."""
    parts = rel.replace("\\", "/").split("/")
    if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts) \
            or any(unicodedata.category(c) == "Cc" for c in rel):
        return None
    path = root.joinpath(*parts)
    base = root.resolve()
    return path if path.resolve().is_relative_to(base) and path.resolve() != base else None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _regular(path: Path, root: Path) -> bool:
    """A regular file, not a symlink, and inside root (a payload's outputs stay in its work dir)."""
    try:
        return path.is_file() and not path.is_symlink() and path.resolve().is_relative_to(Path(root).resolve())
    except OSError:
        return False
