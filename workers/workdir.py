"""The work dir of one attempt, as both launchers (``workers.launch``, ``workers.runner``) lay it out and
report on it: ``item.json``, ``ckpt/`` filled from the kept checkpoint, an empty ``out/``, and the
``LaunchResult`` an attempt comes to. The payload side of the contract is ``workers/payloads/README.md``.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from upwell.messages import WorkItem
from workers.payloads.common import EXIT_FILE, ITEM_FILE

LOG_FILE = "payload.log"
OWN_FILE = "payload.log.own"  # how many of payload.log's bytes upwell wrote itself (the command lines)


@dataclass
class LaunchResult:
    """What one attempt of a payload came to.

    status is "succeeded" (exit 0), "preempted" (exit 75: stopped and checkpointed)
    or "failed" (anything else, or a timeout). ``permanent`` is True for exit 65
    (the payload says its input is unusable, so a retry cannot help).
    """

    status: str
    exit_code: int | None
    metrics: dict[str, Any]
    artifacts: list[Path]
    checkpoint_dir: Path
    checkpoints: int
    resumed_from: Any
    stderr_tail: str
    run_s: float
    log_path: Path | None = None
    timed_out: bool = False
    permanent: bool = False
    definition: dict[str, Any] = field(default_factory=dict)  # name, version, sha256, image digest (provenance)
    cpu_wait_s: float = 0.0  # how long the payload waited for a CPU it was ready to use (the node clock's watch)
    hosts: list[str] = field(default_factory=list)  # a gang's: the allocation's hosts its ranks ran over (workers.gang)
    gpus: list[str] = field(default_factory=list)  # the node's GPUs the shard was given (workers.gpus); []: none
    cpu_s: float | None = None  # the payload's CPU seconds (user + system, its children included; workers.procs.Usage)
    max_rss_mb: float | None = None  # its largest process's peak resident set, MiB

    def measured(self, outcome: Any) -> LaunchResult:
        """This result with the usage the supervision measured (``workers.payload_process.Outcome``)."""
        self.cpu_s, self.max_rss_mb = outcome.cpu_s, outcome.max_rss_mb
        return self
    checkpoint_note: str = ""  # why a checkpoint that was there was not resumed from (workers.checkpoints)
    points: list[dict[str, Any]] = field(default_factory=list)  # a block's: each point's entry (workers.blocks)
    # What the payload itself wrote to payload.log (its output and its steps', not the command lines upwell
    # writes before them: ``output_bytes``); 0: it printed nothing, so no log is kept. None: not counted.
    log_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["artifacts"] = [str(p) for p in self.artifacts]
        data["checkpoint_dir"] = str(self.checkpoint_dir)
        data["log_path"] = str(self.log_path) if self.log_path else None
        return data


def prepare_workdir(item: WorkItem, workdir: Path, *, params: dict[str, Any], input_path: Path | None,
                    resume_dir: Path | None, launcher: str) -> None:
    """Write item.json, fill ckpt/ from resume_dir, and start out/ empty."""
    workdir.mkdir(parents=True, exist_ok=True)
    ckpt, out = workdir / "ckpt", workdir / "out"
    ckpt.mkdir(exist_ok=True)
    if resume_dir is not None and Path(resume_dir).resolve() != ckpt:
        shutil.copytree(resume_dir, ckpt, dirs_exist_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    (workdir / EXIT_FILE).unlink(missing_ok=True)
    doc = {"schema": 1, "job_id": item.job_id, "shard_id": item.shard_id, "payload": item.payload,
           "params": params, "attempt": item.attempt, "ranks": item.ranks, "gpus": item.gpus,
           "input_path": str(Path(input_path).resolve()) if input_path else None,
           "input_blob": item.input_blob, "trace_id": item.trace_id, "launcher": launcher,
           "checkpoint_prefix": item.checkpoint_prefix, "result_prefix": item.result_prefix}
    (workdir / ITEM_FILE).write_text(json.dumps(doc, indent=1))


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; {} when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def log_line(workdir: Path, text: str) -> None:
    """Append one of upwell's own lines (a command line, before that command's output) to ``W/payload.log``
    and count its bytes in ``W/payload.log.own``, so that ``output_bytes`` tells an attempt whose payload
    printed nothing from one that printed something: only the former's log is left behind."""
    data = text.encode()
    with open(Path(workdir) / LOG_FILE, "ab") as log:
        log.write(data)
    own = Path(workdir) / OWN_FILE
    own.write_text(str(_own(own) + len(data)))


def output_bytes(workdir: Path) -> int:
    """The bytes of ``W/payload.log`` that the payload (its processes and steps) wrote: the log's size less
    upwell's own lines (``log_line``). 0 when there is no log."""
    try:
        size = (Path(workdir) / LOG_FILE).stat().st_size
    except OSError:
        return 0
    return max(0, size - _own(Path(workdir) / OWN_FILE))


def _own(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (OSError, ValueError):
        return 0
