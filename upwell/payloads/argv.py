"""The argv a definition runs for one work item: one function for every place it runs.

The local runner (``workers.runner``), and the Batch, VM Scale Set and Container
Instances request builders (``container_run``) all call ``command_argv``, so a
definition's command is the same argv on this machine and in its image on a pool.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from upwell.messages import WorkItem
from upwell.payloads.definition import Definition, argv_text, render

IMAGE_WORKDIR = "/work"  # the work dir inside a payload's container


def values_for(d: Definition, item: WorkItem, workdir, params: dict[str, Any],
               python: str = sys.executable) -> dict[str, str]:
    """Placeholder values: the params, then the built-ins (which params may not shadow)."""
    w = PurePosixPath(str(workdir))
    values = {k: argv_text(v) for k, v in params.items()}
    values.update(workdir=str(w), out=str(w / "out"), ckpt=str(w / "ckpt"), input=str(w / d.input.path),
                  ranks=str(max(1, int(item.ranks))), gpus=str(item.gpus), job_id=item.job_id,
                  shard_id=item.shard_id, attempt=str(item.attempt), python=python)
    return values


def command_argv(d: Definition, values: dict[str, str], *, resume: bool) -> list[str]:
    """The command's argv as it runs: launcher prefix, command, and the resume argv when resuming."""
    argv = [render(a, values) for a in d.command]
    if resume:
        argv += [render(a, values) for a in d.checkpoint.resume]
    if d.launcher.kind == "mpi":
        argv = [render(a, values) for a in d.launcher.mpiexec] + argv
    elif d.launcher.kind == "torchrun":
        argv = [render(a, values) for a in d.launcher.torchrun] + argv
    return argv


@dataclass(frozen=True)
class ContainerRun:
    """One payload command in its image: what a pool request carries."""

    image: str
    argv: list[str]
    workdir: str = IMAGE_WORKDIR
    env: dict[str, str] = field(default_factory=dict)

    def command_line(self) -> str:
        """For APIs that take one string (a Batch task): POSIX-quoted, so it splits back into ``argv``."""
        return shlex.join(self.argv)


def container_run(d: Definition, item: WorkItem, params: dict[str, Any], *, resume: bool = False) -> ContainerRun:
    """The definition's image and the argv for ``item`` (params already validated, defaults filled in)."""
    values = values_for(d, item, IMAGE_WORKDIR, params, python="python")
    return ContainerRun(d.image, command_argv(d, values, resume=resume), env=dict(d.env))
