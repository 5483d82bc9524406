"""An instrument drop's job row and lease come before its read (``JobAcceptor.open_read``), on Azurite.

The job shows (status "ingesting") while the drop is read, so a multi-GB drop is not invisible for the minute
its read takes; the reconciler takes it for a live ingest, not a missed upload; a second delivery meanwhile
steps back without reading it; the lease renews itself as the read
goes on, so a long read is never taken for a stuck one; a read that breaks gives its lease back at once, so the
host's next delivery goes ahead; and a drop refused half-way has its row turned into the rejection. The read is
held, slowed or broken at a shard through ``InputSharder._keep``, where each cut shard is kept.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import pytest

from upwell import names
from upwell.errors import TransientError
from upwell.ingest import lease
from upwell.ingest.ingestor import Ingestor
from upwell.ingest.shardinputs import InputSharder
from upwell.ingest.submit import push_rules, submit
from upwell.ledger import Ledger
from upwell.messages import decode
from upwell.ops.reconcile import Reconciler
from upwell.settings import Settings
from upwell.storage import Storage

REPO = Path(__file__).resolve().parents[2]
DROP = REPO / "samples" / "instrument" / "buoy-2026-11-30.csv"  # 4,000 rows: four shards of 1,000


@pytest.fixture
def store(azurite):
    s = Storage(azurite.connection_string)
    s.ensure()
    s.queue(names.work_queue("cpu")).clear_messages()
    push_rules(s, [REPO / "samples" / "pipelines"])
    return s


def _drop(store: Storage, tmp_path: Path, data: bytes | None = None):
    """Upload the buoy drop (or ``data``) under a fresh name; (its name under incoming/, its job id)."""
    local = tmp_path / f"buoy-{time.monotonic_ns()}.csv"
    local.write_bytes(DROP.read_bytes() if data is None else data)
    [up] = submit(store, [local], "instruments/buoy/")
    return up.blob, up.job_id


def _at_each_keep(monkeypatch, act) -> None:
    """Call ``act(index)`` before each shard the read keeps."""
    keep = InputSharder._keep

    def held(self, uploads, job_id, index, *args, **kwargs):
        act(index)
        return keep(self, uploads, job_id, index, *args, **kwargs)

    monkeypatch.setattr(InputSharder, "_keep", held)


def _work_items(store: Storage, job_id: str) -> int:
    """The job's work items on the cpu queue (peeked: they stay as they are)."""
    return sum(decode(m.content).job_id == job_id
               for m in store.queue(names.work_queue("cpu")).peek_messages(max_messages=32))


def test_the_job_shows_while_its_drop_is_read_and_a_second_delivery_steps_back(store, tmp_path, monkeypatch):
    name, job_id = _drop(store, tmp_path)
    reached, go = threading.Event(), threading.Event()
    _at_each_keep(monkeypatch, lambda i: (reached.set(), go.wait(60)) if i == 2 else None)
    outcomes = []
    reader = threading.Thread(target=lambda: outcomes.append(Ingestor(store, Settings()).ingest(name)))
    reader.start()
    try:
        assert reached.wait(60), "the read never reached its third shard"
        during = Ledger(store).job(job_id)
        assert during is not None and during.status == "ingesting", during
        assert lease.live(during, time.time(), Settings().ingest_lease_s)
        # The reconciler, with no grace, finds the drop's ingest live and leaves it (before the row came first,
        # a read longer than the grace had no row, looked like a missed upload, and was re-driven under it).
        # A dry run: it says what it would re-drive and changes nothing (other tests' uploads are in this Azurite).
        passed = Reconciler(store, dataclasses.replace(Settings(), reconcile_grace_s=0),
                            dry_run=True).run((names.INCOMING,))
        assert not [a for a in passed.actions if name in a.target], passed.actions
        chunks = []
        monkeypatch.setattr(Storage, "chunks", lambda *a, **k: chunks.append(a) or iter(()))
        second = Ingestor(store, Settings()).ingest(name)  # the host delivers the same upload again
        assert second.status == "leased" and not chunks, (second, chunks)  # it stepped back, read nothing
        monkeypatch.undo()
    finally:
        go.set()
        reader.join(60)
    assert [o.status for o in outcomes] == ["accepted"] and outcomes[0].shards == 4, outcomes
    row = Ledger(store).job(job_id)
    assert row.status == "accepted" and row.shards_total == 4 and row.created_at == during.created_at
    assert row.ingest_beat_at == 0  # the lease given up with the accept
    assert _work_items(store, job_id) == 4


def test_the_lease_renews_itself_through_a_read_longer_than_the_lease(store, tmp_path, monkeypatch):
    name, job_id = _drop(store, tmp_path)
    settings = dataclasses.replace(Settings(), ingest_lease_s=0.8)
    ledger, seen = Ledger(store), []

    def slow(index: int) -> None:
        if index:  # the row exists from the start: each later shard finds the lease live
            row = ledger.job(job_id)
            seen.append(lease.live(row, time.time(), settings.ingest_lease_s))
        time.sleep(0.4)  # four shards: 1.6 s of reading, twice the lease

    _at_each_keep(monkeypatch, slow)
    started = time.monotonic()
    out = Ingestor(store, settings).ingest(name)
    assert out.status == "accepted" and time.monotonic() - started > 2 * settings.ingest_lease_s
    assert seen == [True, True, True], seen


def test_a_read_that_breaks_gives_its_lease_back_and_the_next_delivery_goes_ahead(store, tmp_path, monkeypatch):
    name, job_id = _drop(store, tmp_path)

    def broken(index: int) -> None:
        if index == 2:
            raise TransientError("storage went away half-way through the read")

    _at_each_keep(monkeypatch, broken)
    with pytest.raises(TransientError):
        Ingestor(store, Settings()).ingest(name)
    row = Ledger(store).job(job_id)
    assert row.status == "ingesting" and row.ingest_beat_at == 0, row  # released: no need to wait it out
    assert _work_items(store, job_id) == 0
    monkeypatch.undo()
    out = Ingestor(store, Settings()).ingest(name)  # the host's next delivery, at once
    assert out.status == "accepted" and out.shards == 4 and _work_items(store, job_id) == 4
    assert Ledger(store).job(job_id).status == "accepted"


def test_a_drop_refused_half_way_turns_its_row_into_the_rejection(store, tmp_path):
    lines = DROP.read_bytes().split(b"\n")
    lines[2500] = b"125.00,0.1,not-a-number,0.3"  # the file's line 2501 (the header is 1): in the third shard
    name, job_id = _drop(store, tmp_path, b"\n".join(lines))
    out = Ingestor(store, Settings()).ingest(name)
    assert out.status == "rejected" and "pitch" in out.message, out
    row = Ledger(store).job(job_id)
    assert row.status == "rejected" and row.error_row == 2501 and row.error_field == "pitch", row
    assert store.exists(f"{names.QUARANTINE}/{name}") and _work_items(store, job_id) == 0
