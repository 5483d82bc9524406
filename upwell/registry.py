"""The payload registry: a closed set, as a plain dict.

A manifest names a payload by key; it can never carry a command. ``module`` is
the worker module the agent runs (``python -m <module> --workdir W``), launched
plain, under ``mpiexec`` or under ``torchrun``. upwell never imports the module;
it only validates parameters against ``params``.
"""

from __future__ import annotations

from dataclasses import dataclass

from upwell import params as P


@dataclass(frozen=True)
class PayloadSpec:
    name: str
    module: str
    launcher: str  # "python" | "mpi" | "torchrun"
    pool: str  # the pool it runs on unless the manifest says otherwise
    params: type[P.Params]
    needs_input: bool = False  # True: the shard carries a data blob


PAYLOADS: dict[str, PayloadSpec] = {
    "logistic": PayloadSpec("logistic", "workers.payloads.logistic", "python", "cpu", P.LogisticParams),
    "channel-stats": PayloadSpec("channel-stats", "workers.payloads.channel_stats", "python", "cpu",
                                 P.ChannelStatsParams, needs_input=True),
    "welch": PayloadSpec("welch", "workers.payloads.welch", "python", "cpu", P.WelchParams,
                         needs_input=True),
    "heat-mpi": PayloadSpec("heat-mpi", "workers.payloads.heat", "mpi", "mpi", P.HeatParams),
    "train-torch": PayloadSpec("train-torch", "workers.payloads.train", "torchrun", "gpu", P.TrainParams),
}

# Exit codes of the payload process (see workers/payloads/README.md).
EXIT_OK = 0
EXIT_PREEMPTED = 75  # checkpointed on SIGTERM; not a failure
EXIT_BAD_INPUT = 65  # the input cannot be used (EX_DATAERR): permanent, never retried


def get(name: str) -> PayloadSpec:
    from upwell.errors import InputRejected

    try:
        return PAYLOADS[name]
    except KeyError:
        raise InputRejected(f"payload {name!r} is not registered; known: {sorted(PAYLOADS)}",
                            field="payload") from None
