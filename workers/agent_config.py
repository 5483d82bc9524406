"""The agent's configuration, read once from the node's environment at start-up (``AgentConfig.from_env``).

This is the one module that reads the shared-machine setting (``SHARED_MACHINE``, which ``upwell up``
sets for its local workers): it picks the node clock (``workers.supervision.node_clock``).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from upwell.nodelog import Liveness
from upwell.pools.build_slurm import APPTAINER_ENV
from upwell.settings import env_bool, env_float, env_int
from workers.gang import gang_nodes

SHARED_MACHINE = "UPWELL_SHARED_MACHINE"  # local nodes share this machine's CPUs (upwell.local.stack sets it)
EVICTION_WATCH = "UPWELL_EVICTION_WATCH"  # an Azure node: watch Scheduled Events (the Azure pools set it)
IMDS_URL = "UPWELL_IMDS_URL"  # IMDS's base URL: Azure's by default, the stand-in in tests
AZURE_IMDS = "http://169.254.169.254"


@dataclass(frozen=True)
class AgentConfig:
    """One agent's settings: its pool and node, the lease and retry timings, slots, scratch and limits."""

    pool: str
    lease_s: int = 60  # visibility timeout, extended every lease_s / 3 while the payload runs
    idle_exit_s: float = 0.0  # 0: never exit for idleness
    poll_s: float = 1.0
    max_dequeue_count: int = 5  # real failures before poison (host.json maxDequeueCount)
    retry_backoff_s: float = 2.0  # a failed attempt waits backoff * 2^(attempt-1) s, at most 60
    defer_s: int = 2  # a shard whose job is at its concurrency cap waits this long (plus jitter)
    node_id: str = ""
    spot: bool = False
    vm_size: str = "local"
    state_file: str = ""  # where the local pool reads this worker's state
    scratch: str = ""
    max_items: int = 0  # 0: unlimited
    ranks: int = 0  # the allocation's ranks (a Slurm job's CPUs): an MPI payload runs with these; 0: the item's
    slots: int = 1  # work items run at once (the pool's tasks per node); 1: one after another
    refill_s: float = 0.5  # UPWELL_REFILL_S: a freed slot waits this long for the others, to fill them in one receive
    gang_nodes: int = 1  # the allocation's nodes (workers.gang): a gang agent takes only shards of as many
    apptainer: bool = False  # BYO payloads run in their definition's image through Apptainer (a Slurm pool's option)
    job_row_ttl_s: float = 5.0  # a job row read this recently is reused (workers.jobrows); 0: read every delivery
    shared_machine: bool = False  # local nodes share this machine's CPUs: picks the node clock (workers.supervision)
    eviction_watch: bool = False  # poll Scheduled Events (workers.eviction): on Azure nodes only
    imds_url: str = AZURE_IMDS
    eviction_poll_s: float = 1.0
    beat_s: float = 30.0  # periodic heartbeats into the nodes table (workers.node.Heartbeat); UPWELL_BEAT_S

    @classmethod
    def from_env(cls, pool: str, **overrides) -> AgentConfig:
        """From the node's environment; a bad value raises ConfigError naming the variable."""
        env = os.environ
        node = env.get("UPWELL_NODE_ID") or env.get("AZ_BATCH_NODE_ID") or f"{socket.gethostname()}-{os.getpid()}"
        kw = dict(pool=pool, node_id=node, spot=env_bool(env, "UPWELL_NODE_SPOT"),
                  vm_size=env.get("UPWELL_VM_SIZE", "local"), state_file=env.get("UPWELL_STATE_FILE", ""),
                  scratch=env.get("UPWELL_SCRATCH", ""),
                  max_dequeue_count=env_int(env, "UPWELL_MAX_DEQUEUE_COUNT", 5, minimum=1),
                  lease_s=env_int(env, "UPWELL_LEASE_S", 60, minimum=1),
                  retry_backoff_s=env_float(env, "UPWELL_RETRY_BACKOFF_S", 2.0, minimum=0),
                  poll_s=env_float(env, "UPWELL_POLL_S", 1.0, minimum=0.01),
                  ranks=env_int(env, "UPWELL_RANKS", 0, minimum=0),
                  slots=env_int(env, "UPWELL_SLOTS", 1, minimum=1), gang_nodes=gang_nodes(env),
                  refill_s=env_float(env, "UPWELL_REFILL_S", 0.5, minimum=0),
                  apptainer=env_bool(env, APPTAINER_ENV),
                  job_row_ttl_s=env_float(env, "UPWELL_JOB_ROW_TTL_S", 5.0, minimum=0),
                  shared_machine=env_bool(env, SHARED_MACHINE),
                  eviction_watch=env_bool(env, EVICTION_WATCH), imds_url=env.get(IMDS_URL) or AZURE_IMDS,
                  eviction_poll_s=env_float(env, "UPWELL_EVICTION_POLL_S", 1.0, minimum=0.2),
                  beat_s=Liveness.from_env(env).beat_s)
        kw.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**kw)
