"""The estimate before dispatch: price the nodes that will run, and learn node time from past results.

Before dispatch a job's cost is estimated as the sum over its shards of node-seconds x the
blended price of the pool x the job's share of a node:

- node-seconds per shard *blend* the manifest's ``estimate.node_seconds_per_shard`` with the
  paid node-seconds of earlier shards of the same payload and pool, each figure weighted by how
  much it says about this shard: the manifest's as much as ``PRIOR_SAMPLES`` samples, each earlier
  shard of the same size (the same parameters, ranks and nodes) as one, each of another size as
  ``OTHER_SIZE_WEIGHT`` of one. A few results so move the estimate a little and many move it most
  of the way; none leave the manifest's. The range puts each group's 10th and 90th percentile in place
  of its median. Each figure is one node's seconds (a gang's recorded node-seconds are divided by its
  nodes when learned);
- a shard of several nodes (upwell.shape) holds each of them: its node-seconds are ``nodes`` times
  one node's, so a 2-node shard's estimate is 2 x node-seconds x price x share (a Batch multi-instance
  task runs on numberOfInstances compute nodes at once, per Batch's MPI page, each a VM the pool pays for;
  a Slurm job of ``-N k`` holds k nodes for its whole run);
- the price is the pool's: its spot share of spot prices (only when the job allows spot) and
  the rest pay-as-you-go, on the pool's price key (a local pool's key too);
- the share is the shard's CPUs (ranks on one node: ranks per node) or GPUs over the VM's
  (upwell.cost.prices.node_share).

``for_job`` is the one entry: ``upwell submit --dry-run`` (upwell.ingest.submit) and ingest
(upwell.ingest.accept) both call it, so the two print and record the same figures. Learning reads
the ledger (the last ``MAX_JOBS`` finished jobs of the payload among the last ``LOOKBACK`` that ended,
through the index of ended jobs: bounded however many jobs ever ran), so it needs no state of its own and
a fresh deployment falls back to the manifest.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from upwell.cost.prices import PriceTable, blended_per_hour, load, node_share
from upwell.errors import NotFound
from upwell.rows import JobState, ShardState

if TYPE_CHECKING:
    from upwell.ledger import Ledger
    from upwell.settings import PoolSpec

MAX_JOBS = 10
LOOKBACK = 100  # ended jobs (newest first) that learn() looks among for the payload's last MAX_JOBS
SHARDS_PER_JOB = 1000  # shard rows learn() reads of one job: a sample of a big sweep, in shard id order
FINISHED = (JobState.SUCCEEDED, JobState.PARTIALLY_FAILED)


def size_key(params: dict | str | None, ranks: int = 1, gpus: int = 0, nodes: int = 1) -> str:
    """The size of one shard: its parameters and resources (a grid point's own values), hashed. The nodes
    are in the key only when several (the keys of one-node shards learned before gangs stay the same)."""
    if isinstance(params, str):
        try:
            params = json.loads(params or "{}")
        except ValueError:
            params = {"_": params}
    size = {"p": params or {}, "r": int(ranks or 1), "g": int(gpus or 0)}
    if int(nodes or 1) > 1:
        size["n"] = int(nodes)
    text = json.dumps(size, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


PRIOR_SAMPLES = 3.0  # the manifest's figure weighs as much as this many results of the same size
OTHER_SIZE_WEIGHT = 0.25  # a result of another size (other parameters) weighs this much of one of the same size


@dataclass(frozen=True)
class PerShard:
    """One shard's node-seconds: the blend, its range, and what it rests on ('size', 'payload', 'manifest')."""

    seconds: float
    low: float
    high: float
    how: str


def _spread(samples: list[float]) -> tuple[float, float, float]:
    """(10th percentile, median, 90th percentile) of the samples (all three the one value of one)."""
    if len(samples) == 1:
        return samples[0], samples[0], samples[0]
    deciles = statistics.quantiles(samples, n=10, method="inclusive")
    return deciles[0], statistics.median(samples), deciles[-1]


@dataclass
class History:
    """Paid node-seconds of earlier successful shards: per size key, and all of them."""

    by_size: dict[str, list[float]] = field(default_factory=dict)
    all: list[float] = field(default_factory=list)
    jobs: int = 0

    def add(self, key: str, seconds: float) -> None:
        self.by_size.setdefault(key, []).append(seconds)
        self.all.append(seconds)

    def per_shard(self, key: str, fallback: float) -> PerShard:
        """The manifest's ``fallback`` blended with the results of this size and of the others, by weight."""
        same = self.by_size.get(key, [])
        other = [s for k, v in self.by_size.items() if k != key for s in v]
        groups = [(PRIOR_SAMPLES, (float(fallback),) * 3)]
        groups += [(float(len(same)), _spread(same))] if same else []
        groups += [(OTHER_SIZE_WEIGHT * len(other), _spread(other))] if other else []
        total = sum(w for w, _ in groups)
        low, mid, high = (sum(w * spread[i] for w, spread in groups) / total for i in range(3))
        return PerShard(mid, low, high, "size" if same else "payload" if other else "manifest")


def learn(ledger: Ledger, payload: str, pool: str, *, max_jobs: int = MAX_JOBS) -> History:
    """History of ``payload`` on ``pool`` from the ledger's most recent finished jobs; none on an account whose
    jobs table does not exist yet (a dry run before the first `upwell up` or deployment made it).

    Bounded, whatever the history: the newest ``LOOKBACK`` entries of the ledger's index of ended jobs (one
    range read), their job rows read newest first until ``max_jobs`` of this payload and pool are found, and
    at most ``SHARDS_PER_JOB`` shard rows of each (one range read a page). A query of the jobs table by
    payload would be a table scan, whose cost grows with every job ever run."""
    hist = History()
    try:
        for job in ledger.index.last_ended(ledger.job, LOOKBACK) if max_jobs > 0 else ():
            if job.status not in FINISHED or job.payload != payload or job.pool != pool:
                continue
            hist.jobs += 1
            rows, _ = ledger.shard_page(job.job_id, limit=SHARDS_PER_JOB)
            nodes = max(int(job.nodes or 1), 1)
            for row in rows:
                # one node's (the estimate multiplies by the nodes again), and one point's: a block
                # (upwell.ingest.blocks) ran point_count points, which the estimate counts one by one
                seconds = row.paid_seconds / nodes / row.point_count
                if row.status == ShardState.SUCCEEDED and seconds > 0:
                    hist.add(size_key(row.params, job.ranks or 1, job.gpus, nodes), seconds)
            if hist.jobs >= max_jobs:
                break  # before the next row is read
    except NotFound:
        return History()
    return hist


@dataclass(frozen=True)
class JobEstimate:
    node_seconds: float  # summed over shards, times the nodes each holds (node time, before the share)
    usd: float
    per_hour: float  # blended $/node-hour
    spot_fraction: float
    share: float
    basis: str  # e.g. "learned from 2 earlier job(s) for 3 of 3 shards, blended with the manifest's 60 s a shard"
    usd_low: float = 0.0  # the range: each history group's 10th and 90th percentile in place of its median
    usd_high: float = 0.0


def estimate(points: Iterable[dict], *, history: History, manifest_s: float, price_key: str, spot_allowed: bool,
             pool_spot_share: float, ranks: int = 1, gpus: int = 0, nodes: int = 1,
             prices: PriceTable | None = None) -> JobEstimate:
    """The job's estimate from its shards' parameters: per shard, one node's seconds x ``nodes``; ``ranks``
    in all over the nodes (the share is one node's: ranks per node). An unknown price key prices at $0 (and
    says so)."""
    table = prices or load()
    nodes = max(int(nodes or 1), 1)
    counts = {"size": 0, "payload": 0, "manifest": 0}
    total = low = high = 0.0
    for params in points:
        one = history.per_shard(size_key(params, ranks, gpus, nodes), manifest_s)
        counts[one.how] += 1
        total, low, high = total + one.seconds * nodes, low + one.low * nodes, high + one.high * nodes
    fraction = float(pool_spot_share) if spot_allowed else 0.0
    share = node_share(price_key, math.ceil(max(int(ranks or 1), 1) / nodes), gpus, prices=table)
    try:
        per_hour = blended_per_hour(price_key, fraction, prices=table)
    except Exception:  # noqa: BLE001 - ConfigError: a key not in the table
        per_hour = 0.0
    learned = counts["size"] + counts["payload"]
    basis = (f"learned from {history.jobs} earlier job(s) for {learned} of {sum(counts.values())} shards, "
             f"blended with the manifest's {float(manifest_s):g} s a shard" if learned else "from the manifest")
    rate = per_hour * share / 3600.0  # $ per node-second
    return JobEstimate(total, total * rate, per_hour, fraction, share, basis, low * rate, high * rate)


def for_job(ledger: Ledger | None, *, payload: str, pool: str, spec: PoolSpec, points: list[dict],
            manifest_s: float, spot: bool, resources, history: History | None = None) -> JobEstimate:
    """The one estimate of a job, for ``submit --dry-run`` and ingest alike: node time learned from the
    ledger's results of the definition ``payload`` (its name, not the manifest's ``name@version``) on ``pool``
    (``history``: already learned; no ledger: none), priced on the pool's key and spot share. ``resources``:
    the shard's ranks, gpus and nodes as ingest resolves them."""
    if history is None:
        history = learn(ledger, payload, pool) if ledger is not None else History()
    return estimate(points, history=history, manifest_s=manifest_s, price_key=spec.price_key,
                    spot_allowed=bool(spot), pool_spot_share=spec.spot_share, ranks=resources.ranks,
                    gpus=resources.gpus, nodes=resources.nodes)
