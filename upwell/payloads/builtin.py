"""The built-in Python payloads, as the launcher sees them: derived from their definitions.

Every payload is a definition (``upwell.payloads``); the five built-in ones in
``payloads/*.yaml`` name a worker module (``module``) that their command runs
(``{python} -m <module> --workdir {workdir}``), plain, under ``mpiexec`` or under
``torchrun``. ``PayloadSpec`` is the launcher's view of such a definition. A
manifest names a payload; it can never carry a command.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from upwell.payloads import models as P
    from upwell.payloads.definition import Definition


@dataclass(frozen=True)
class PayloadSpec:
    name: str
    module: str
    launcher: str  # "python" | "mpi" | "torchrun"
    pool: str  # the pool it runs on unless the manifest says otherwise
    params: type[P.Params]
    needs_input: bool = False  # True: the shard carries a data blob
    image: str = ""  # the definition's image, pinned by digest
    aggregate: str = ""  # report section that aggregates shards (see upwell.results.figures)
    command: tuple[str, ...] = ()  # the definition's argv template


def spec_of(d: Definition) -> PayloadSpec:
    from upwell.payloads.params import BUILTIN_MODELS

    return PayloadSpec(d.name, d.module, "python" if d.launcher.kind == "plain" else d.launcher.kind, d.pool,
                       BUILTIN_MODELS[d.module], needs_input=d.input.required, image=d.image,
                       aggregate=d.report.section, command=tuple(d.command))


@functools.cache
def _payloads() -> dict[str, PayloadSpec]:
    from upwell.payloads.registry import builtins

    return {name: spec_of(loaded.definition) for name, loaded in builtins().items() if loaded.definition.module}


# Exit codes of the payload process (see workers/payloads/README.md). A payload process imports this
# module for them only, so the definitions are read on first use (``get``), never at import.
EXIT_OK = 0
EXIT_PREEMPTED = 75  # checkpointed on SIGTERM; not a failure
EXIT_BAD_INPUT = 65  # the input cannot be used (EX_DATAERR): permanent, never retried


def get(name: str) -> PayloadSpec:
    from upwell.errors import InputRejected

    try:
        return _payloads()[name]
    except KeyError:
        raise InputRejected(f"payload {name!r} is not a built-in Python payload; known: {sorted(_payloads())}",
                            field="payload") from None
