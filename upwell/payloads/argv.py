"""The argv a definition runs for one work item: one function for every place it runs.

The local runner (``workers.runner``) calls ``command_argv``. On a pool the agent runs
inside the definition's image and calls the same runner, so a definition's command is
the same argv on this machine and in its image on a pool.
"""

from __future__ import annotations

import sys
from pathlib import PurePosixPath
from typing import Any

from upwell.messages import WorkItem
from upwell.payloads.definition import Definition, argv_text, render


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
