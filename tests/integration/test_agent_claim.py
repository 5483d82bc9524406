"""The agent's claim of a first delivery, on Azurite: one conditional write and no read of the shard row.

Ingest writes the shard rows in entity-group transactions and puts each row's ETag, as the transaction's
response gave it, into the row's work item (upwell.ingest.accept); the agent claims If-Match that ETag with
the row taken as ingest wrote it (workers.delivery ``as_ingested``). A row that changed since (cancelled,
claimed by a twin delivery, ended) fails that condition, and the agent reads it and decides as it always
did: a cancelled shard is not run, a finished one is not run again.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from urllib.parse import unquote

from tests.faults.request_meter import RequestMeter
from tests.pipeline_helpers import ingest_manifest
from upwell import names
from upwell.ledger import Ledger, ShardState
from upwell.messages import decode
from upwell.settings import Settings
from upwell.storage import Storage
from workers.agent import Agent, AgentConfig

QUEUE = names.work_queue("cpu")


class Urls(RequestMeter):
    """Every request this process sends while entered, as ``(method, decoded URL)``."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, str]] = []

    def count(self, method: str, url: str) -> None:
        self.sent.append((method, unquote(url)))

    def on_row(self, method: str, job_id: str, shard_id: str) -> int:
        """Requests of ``method`` on one shard row (a point GET, or a PATCH of it)."""
        key = f"jobs(PartitionKey='{job_id}',RowKey='{shard_id}')"
        return sum(1 for m, url in self.sent if m == method and key in url)


def _agent(store: Storage, tmp_path: Path) -> Agent:
    config = AgentConfig(pool="cpu", node_id=f"node-{time.monotonic_ns()}", scratch=str(tmp_path / "scratch"),
                         state_file=str(tmp_path / "agent.json"), poll_s=0.1, retry_backoff_s=0)
    return Agent(store, config, Settings())


def _received(store: Storage, n: int) -> dict[str, object]:
    """The ``n`` messages on the cpu queue, leased for a minute, by shard id."""
    msgs = store.receive_many(QUEUE, visibility_timeout=60, max_messages=n)
    assert len(msgs) == n, [m.content for m in msgs]
    return {decode(m.content).shard_id: m for m in msgs}


def test_ingest_carries_each_rows_etag_and_a_first_claim_is_one_write_with_no_read(store, tmp_path):
    ledger = Ledger(store)
    job = ingest_manifest(store, "claim/first/job.yaml", "payload: logistic\ngrid: {r: [3.1, 3.2]}\n")
    msgs = _received(store, 2)
    for sid, msg in msgs.items():  # the transaction's ETag is the one a later read of the row shows
        item, row = decode(msg.content), ledger.shard(job, sid)
        assert item.row_etag and item.row_etag == row.etag and item.queued_at == row.queued_at, (item, row)
    agent = _agent(store, tmp_path)
    with Urls() as urls:
        outcomes = [agent.handle(msgs[sid]) for sid in sorted(msgs)]
    assert outcomes == ["succeeded", "succeeded"]
    for sid in msgs:
        assert urls.on_row("GET", job, sid) == 0 and urls.on_row("PATCH", job, sid) == 1, urls.sent
        row = ledger.shard(job, sid)
        assert row.status == ShardState.RUNNING and row.attempts == 1 and row.node == agent.node.id
        assert row.first_started_at and row.queued_at == decode(msgs[sid].content).queued_at
        result = json.loads(store.read(f"{names.RESULTS}/{job}/{sid}.json"))
        assert result["timings"]["queued"] == row.queued_at and result["timings"]["queue_wait_s"] is not None


def test_a_row_changed_since_ingest_is_read_and_decided_as_before(store, tmp_path):
    ledger = Ledger(store)
    job = ingest_manifest(store, "claim/moved/job.yaml", "payload: logistic\ngrid: {r: [3.1, 3.2]}\n")
    msgs = _received(store, 2)
    agent = _agent(store, tmp_path)
    assert ledger.shard_cancelled(job, "s00000")  # the row changes after ingest wrote it
    with Urls() as urls:
        assert agent.handle(msgs["s00000"]) == "duplicate"  # its claim found the row changed; read, it had ended
    assert urls.on_row("GET", job, "s00000") >= 1 and urls.on_row("PATCH", job, "s00000") == 1
    assert ledger.shard(job, "s00000").status == ShardState.CANCELLED
    assert not store.exists(f"{names.RESULTS}/{job}/s00000.json")  # never ran

    assert agent.handle(msgs["s00001"]) == "succeeded"
    first = store.blob(names.RESULTS, f"{job}/s00001.json").get_blob_properties().etag
    store.send(QUEUE, msgs["s00001"].content)  # a twin of its message (an ingest re-drive), with the same ETag
    twin = _received(store, 1)["s00001"]
    assert twin.dequeue_count == 1 and decode(twin.content).row_etag
    with Urls() as urls:
        assert agent.handle(twin) == "duplicate"  # the row moved on (claimed): read; its result exists
    assert urls.on_row("GET", job, "s00001") == 1
    assert store.blob(names.RESULTS, f"{job}/s00001.json").get_blob_properties().etag == first  # not run again
    row = ledger.shard(job, "s00001")
    assert row.attempts == 1 and row.status == ShardState.RUNNING  # collect has not run; the twin changed nothing


def test_a_first_delivery_deferred_at_the_cap_reads_its_row_once_to_record_the_deferral(store, tmp_path):
    """A first delivery's verdict does not hang on the shard row (no failure of it to count yet), so a deferral
    at the job's cap is settled without reading the row first: the one read is the ledger's, as it counts the
    deferral. A cancelled job's first delivery likewise. Only a verdict that writes the row into the result
    (DROP, POISON: workers.settle.SETTLED_ON_ROW) reads it first."""
    ledger = Ledger(store)
    job = ingest_manifest(store, "claim/capped/job.yaml",
                          "payload: logistic\ngrid: {r: [3.1, 3.2]}\nmax_concurrency: 1\n")
    msgs = _received(store, 2)
    assert ledger.shard_started(job, "s00000", node="another-node", pool="cpu", attempt=1)  # holds the one slot
    agent = _agent(store, tmp_path)
    with Urls() as urls:
        assert agent.handle(msgs["s00001"]) == "deferred"
    assert urls.on_row("GET", job, "s00001") == 1, urls.sent  # the deferral's own read-and-write
    row = ledger.shard(job, "s00001")
    assert row.deferrals == 1 and row.status == ShardState.QUEUED and row.attempts == 0
    assert not store.exists(f"{names.RESULTS}/{job}/s00001.json")  # never ran

    other = ingest_manifest(store, "claim/cancelled/job.yaml", "payload: logistic\ngrid: {r: [3.3]}\n")
    msg = _received(store, 1)["s00000"]
    ledger.update_job(other, status="cancelled")
    agent.jobs.forget(other)
    with Urls() as urls:
        assert agent.handle(msg) == "cancelled"
    assert urls.on_row("GET", other, "s00000") == 1, urls.sent  # the ledger's, as it marks the shard
    assert ledger.shard(other, "s00000").status == ShardState.CANCELLED
