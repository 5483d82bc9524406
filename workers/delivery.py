"""One delivery in hand, and the facts about it, gathered once before anything is decided.

``gather`` decodes the message and reads, in this order and each at most once: the shard row (not on a first
delivery of a work item that carries the row's ETag from ingest: the row is then taken as ingest wrote it,
``as_ingested``, and the claim's one conditional write proves it), whether the shard's result exists (a
duplicate needs nothing more; not asked on a first delivery of a shard no agent has started, which has
none), the job row (through the agent's short-lived copies, ``workers.jobrows``), and, when the job has a
concurrency cap, its running shards. Those facts go to ``upwell.verdict`` as they are; the attempt then adds
what it learns (``Hand.started``, ``etag``...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from upwell import names
from upwell.errors import DecodeError
from upwell.lease import Lease
from upwell.ledger import JobRow, Ledger, ShardRow, ShardState
from upwell.messages import WorkItem, decode
from upwell.storage import Storage
from upwell.verdict import concurrency_cap
from workers.jobrows import JobRows


@dataclass
class Hand:
    """The message in hand: its lease, work item (None when it cannot be decoded), bound log, and the
    facts gathered for it; then what the attempt adds: when it started, the shard row's ETag once this
    agent marked it running (collect's first try uses it), whether this agent marked it (``claimed``),
    and how long this slot's thread waited for a CPU while it staged in (the node clock's figure)."""

    msg: Any
    lease: Lease
    item: WorkItem | None
    log: Any
    shard: ShardRow = field(default_factory=ShardRow)
    job: JobRow = field(default_factory=JobRow)
    result_exists: bool = False
    cap: int = 0  # running shards allowed for the job (upwell.verdict.concurrency_cap); 0: no cap
    active: list[tuple[str, str]] = field(default_factory=list)  # the job's running shards, read under a cap
    now: datetime | None = None  # when the facts were gathered
    decode_error: str = ""
    started: str | None = None
    etag: str = ""
    claimed: bool = False
    staging_wait_s: float = 0.0
    agent_nodes: int = 1  # the allocation's node count this agent serves (workers.gang)
    assumed: bool = False  # ``shard`` is the row as the work item says ingest wrote it (``as_ingested``), not read

    def facts(self) -> dict[str, Any]:
        """The keywords of upwell.verdict.decide_delivery."""
        return dict(decoded=self.item is not None, result_exists=self.result_exists,
                    dequeue_count=self.msg.dequeue_count, shard=self.shard, job=self.job, now=self.now,
                    cap=self.cap, active=self.active, agent_nodes=self.agent_nodes,
                    nodes=int(getattr(self.item, "nodes", 1) or 1))

    def seen_row(self) -> dict[str, str] | None:
        """The shard row as this agent last left it, for the result document: status and ETag."""
        if self.etag:
            return {"status": "running", "etag": self.etag}
        if self.shard.etag:
            return {"status": self.shard.status.value, "etag": self.shard.etag}
        return None


def fresh(msg, shard: ShardRow) -> bool:
    """A first delivery of a shard that no agent has started (its row queued, no attempt): it can have no
    result, so none is looked for. A message sent twice that races its twin runs once more at worst, and
    its result's conditional create finds the first and only acknowledges (workers.settle)."""
    return msg.dequeue_count <= 1 and bool(shard.etag) and shard.status == ShardState.QUEUED and not shard.attempts


def as_ingested(item: WorkItem) -> ShardRow:
    """The shard row as ingest wrote it (upwell.ingest.accept ``_write_rows``), from the work item that carries
    its ETag: queued, never attempted, nothing kept; what the agent reads of a row (its counts, ``queued_at``,
    checkpoints, history) is known without reading it. Only a claim If-Match that ETag proves it current."""
    return ShardRow(job_id=item.job_id, shard_id=item.shard_id, status=ShardState.QUEUED, pool=item.pool,
                    input_blob=item.input_blob or "", queued_at=item.queued_at,
                    result_blob=f"{names.RESULTS}/{item.result_blob}", etag=item.row_etag)


def gather(msg, lease: Lease, *, storage: Storage, ledger: Ledger, jobs: JobRows, max_concurrency: int,
           log: Any, agent_nodes: int = 1, assume: bool = False) -> Hand:
    """The facts about one delivery (see the module's docstring). ``agent_nodes``: the allocation's node
    count (a gang agent's k; 1 for a one-node agent). ``assume``: on a first delivery of a work item that
    carries its row's ETag, take the row as ingest wrote it (``as_ingested``) instead of reading it; the
    claim's If-Match then proves it, and a row that moved on is read after all (``workers.agent``)."""
    try:
        item = decode(msg.content)
    except DecodeError as exc:
        return Hand(msg, lease, None, log, decode_error=str(exc))
    hand = Hand(msg, lease, item, log.bind(job_id=item.job_id, shard_id=item.shard_id),
                ShardRow(job_id=item.job_id, shard_id=item.shard_id), JobRow(job_id=item.job_id),
                now=datetime.now(UTC), agent_nodes=agent_nodes)
    hand.assumed = assume and bool(item.row_etag) and msg.dequeue_count <= 1
    hand.shard = as_ingested(item) if hand.assumed else ledger.shard(item.job_id, item.shard_id) or hand.shard
    if not fresh(msg, hand.shard):
        hand.result_exists = storage.exists(f"{names.RESULTS}/{item.result_blob}")
        if hand.result_exists:
            return hand
    hand.job = jobs.get(item.job_id, shard=hand.shard) or hand.job
    hand.cap = concurrency_cap(hand.job, max_concurrency)
    if hand.cap:
        hand.active = ledger.active_shards(item.job_id)
    return hand
