"""The reconciler's change-feed mode, a contract test against a change feed written in Azure's documented layout.

Azurite has no change feed, so tests/changefeed_writer.py writes one into Azurite's ``$blobchangefeed``
(segments.json, hourly segment meta.json files, Avro chunks appended a block at a time). The reconciler
in ``changefeed`` mode must find exactly the uploads whose BlobCreated records come after its cursor,
resume from the cursor on the next pass, ignore other containers and other event types, and re-drive a
missed upload through the same idempotent ingest path as the listing mode (tests/integration/test_reconcile.py).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import uuid

import pytest

from tests.changefeed_writer import FeedWriter, event, hour
from tests.faults.harness import sweep
from tests.pipeline_helpers import module_azurite
from upwell import names
from upwell.errors import ConfigError
from upwell.ingest.blobnames import job_id_for
from upwell.ingest.ingestor import Ingestor
from upwell.ledger import Ledger
from upwell.ops.changefeed import CONTAINER, ChangeFeed, Cursor, segment_key
from upwell.ops.reconcile import Reconciler
from upwell.scalelog import ScalingLog, fresh_reconcile_state
from upwell.settings import Settings
from upwell.storage import Storage

HOUR = dt.timedelta(hours=1)


# A pass may list incoming/ and reads the whole feed, so no other test's blobs may be there.
own_azurite = module_azurite("changefeed", name="own_azurite")


@pytest.fixture
def store(own_azurite, monkeypatch) -> Storage:
    monkeypatch.setenv(names.CONNECTION, own_azurite.connection_string)
    storage = Storage(own_azurite.connection_string)
    storage.ensure()
    for container in (names.INCOMING, CONTAINER):
        client = storage.container(container)
        if client.exists():
            for blob in client.list_blobs():
                client.delete_blob(blob.name)
    ScalingLog(storage).save_reconcile_state(fresh_reconcile_state())
    return storage


@pytest.fixture
def feed(store) -> FeedWriter:
    return FeedWriter(store.container(CONTAINER))


def settings(**kw) -> Settings:
    return dataclasses.replace(Settings.from_env(), **{"reconcile_grace_s": 0, "reconcile_source": "changefeed", **kw})


def upload(store: Storage, name: str, data: bytes) -> str:
    """Upload to incoming/ as an instrument would; no event reaches any host. Returns the ETag."""
    return store.blob(names.INCOMING, name).upload_blob(data, overwrite=True)["etag"]


def created(name: str, etag: str, container: str = names.INCOMING) -> dict:
    return event(container, name, etag)


def start_cursor(store: Storage, when: dt.datetime) -> None:
    """The state a first (listing) pass leaves: the cursor at the segment of the hour of ``when``."""
    state = {"watermark": when.timestamp(), "redrives": {}, "changefeed": Cursor(segment_key(hour(when))).to_dict()}
    ScalingLog(store).save_reconcile_state(state)


def redriven(result) -> list[tuple[str, str, str]]:
    return [(a.kind, a.target, a.outcome) for a in result.actions]


def test_the_reader_reads_only_what_follows_its_cursor(store, feed):
    now = dt.datetime.now(dt.UTC)
    feed.append(now, [created(f"r/{i}.csv", "0x1") for i in range(3)], shard=0)
    feed.append(now, [created("r/3.csv", "0x1")], shard=1)
    feed.append(now + HOUR, [created("r/later.csv", "0x1")], shard=0)  # not consumable yet
    feed.consumable(now)
    reader = ChangeFeed(store.container(CONTAINER))
    assert reader.enabled() and reader.segment_keys(segment_key(now - HOUR), reader.last_consumable()) == [
        segment_key(hour(now))
    ]
    segment = reader.segment(segment_key(hour(now)))
    assert segment.shards == (f"log/00/{segment.key}/", f"log/01/{segment.key}/")
    ((chunk, size),) = reader.chunks(segment.shards[0])
    records, at = reader.records(chunk, size, None)
    assert [r.name for r in records] == ["r/0.csv", "r/1.csv", "r/2.csv"] and at[0] == size
    assert {r.etag for r in records} == {'"0x1"'}, "the feed's ETag gets the quotes a blob's properties have"
    assert reader.records(chunk, size, at)[0] == [], "nothing new: nothing read"
    feed.append(now, [created("r/4.csv", "0x2"), event(names.INCOMING, "r/0.csv", event_type="BlobDeleted")])
    ((chunk, size2),) = reader.chunks(segment.shards[0])
    records, at2 = reader.records(chunk, size2, at)
    assert [(r.event_type, r.name) for r in records] == [("BlobCreated", "r/4.csv"), ("BlobDeleted", "r/0.csv")]
    assert at2[0] == size2 > size
    # A cursor in the middle of a block resumes at the record after the last one consumed.
    middle = [*records[1].position, at2[2]]
    assert [r.event_type for r in reader.records(chunk, size2, middle)[0]] == ["BlobDeleted"]


def test_a_pass_finds_exactly_the_uploads_created_after_its_cursor_and_resumes_there(store, feed):
    tag, now = uuid.uuid4().hex[:6], dt.datetime.now(dt.UTC)
    start_cursor(store, now - HOUR)
    missed = f"cf-{tag}/job.yaml"
    missed_etag = upload(store, missed, sweep("missed", 3))
    handled = f"cf-{tag}/handled/job.yaml"
    handled_etag = upload(store, handled, sweep("handled", 2))
    Ingestor(store, Settings.from_env()).ingest(handled)  # its event came: the job exists
    data_etag = upload(store, f"cf-{tag}/data/input.csv", b"a,b\n1,2\n")  # a manifest's data: never a job
    before = f"cf-{tag}/before/job.yaml"  # no job, but its record is before the cursor: not this mode's to find
    before_etag = upload(store, before, sweep("before", 2))
    later = f"cf-{tag}/later/job.yaml"  # its segment is not consumable yet
    later_etag = upload(store, later, sweep("later", 2))
    feed.append(now - 3 * HOUR, [created(before, before_etag)], status="Finalized")
    feed.append(
        now,
        [
            created(missed, missed_etag),
            created(handled, handled_etag),
            created("shards/x/s00000.json", "0x9", container=names.SHARDS),
            event(names.INCOMING, f"cf-{tag}/gone/job.yaml", event_type="BlobDeleted"),
            created(f"cf-{tag}/data/input.csv", data_etag),
        ],
        shard=0,
    )
    feed.append(
        now,
        [event("", "", event_type="Control"), created(f"cf-{tag}/other.csv", "0x7", container="pipelines")],
        shard=1,
    )
    feed.append(now + HOUR, [created(later, later_etag)])
    feed.consumable(now)

    first = Reconciler(store, settings()).run()
    assert redriven(first) == [("missed_upload", f"incoming/{missed}", "redriven")]
    assert first.listed == 0, "the change feed spared the listing of incoming/"
    assert first.events == 7 and first.checked == 2  # every record of the consumable segments since the cursor
    assert Ledger(store).job(job_id_for(missed, missed_etag)).shards_total == 3
    assert Ledger(store).job(job_id_for(before, before_etag)) is None
    assert Ledger(store).job(job_id_for(later, later_etag)) is None

    second = Reconciler(store, settings()).run()
    assert second.actions == [] and second.events == 0, "the cursor spares every record already read"

    late = f"cf-{tag}/late/job.yaml"
    late_etag = upload(store, late, sweep("late", 2))
    feed.append(now, [created(late, late_etag)], shard=1)  # appended to a chunk already read
    third = Reconciler(store, settings()).run()
    assert redriven(third) == [("missed_upload", f"incoming/{late}", "redriven")] and third.events == 1

    feed.consumable(now + HOUR)
    fourth = Reconciler(store, settings()).run()
    assert redriven(fourth) == [("missed_upload", f"incoming/{later}", "redriven")] and fourth.events == 1
    assert fourth.cursor == segment_key(hour(now + HOUR))


def test_a_missed_upload_takes_the_same_idempotent_ingest_path_as_listing_mode(store, feed, monkeypatch):
    tag, now = uuid.uuid4().hex[:6], dt.datetime.now(dt.UTC)
    start_cursor(store, now)
    first_name, second_name, broken = (f"cf-{tag}/{n}/job.yaml" for n in ("one", "two", "broken"))
    etags = {n: upload(store, n, sweep(n.split("/")[1], 2)) for n in (first_name, second_name, broken)}
    feed.append(now, [created(n, etags[n]) for n in (first_name, second_name, broken)])
    feed.consumable(now)

    # A dry run finds them and moves nothing.
    dry = Reconciler(store, settings(), dry_run=True).run()
    assert [(a.target, a.outcome) for a in dry.actions] == [
        (f"incoming/{n}", "would_redrive") for n in (first_name, second_name, broken)
    ]
    # One re-drive a pass: the cursor stops before the first upload left, and the next pass resumes there.
    real_ingest = Ingestor.ingest

    def ingest(self, name):
        if name == broken:
            raise RuntimeError("storage keeps timing out")
        return real_ingest(self, name)

    monkeypatch.setattr(Ingestor, "ingest", ingest)
    one = Reconciler(store, settings(reconcile_max_actions=1, reconcile_max_redrives=2)).run()
    assert redriven(one) == [("missed_upload", f"incoming/{first_name}", "redriven")]
    two = Reconciler(store, settings(reconcile_max_actions=5, reconcile_max_redrives=2)).run()
    assert [(a.target, a.outcome) for a in two.actions] == [
        (f"incoming/{second_name}", "redriven"),
        (f"incoming/{broken}", "failed"),
    ]
    three = Reconciler(store, settings(reconcile_max_actions=5, reconcile_max_redrives=2)).run()
    assert [(a.target, a.outcome) for a in three.actions] == [(f"incoming/{broken}", "quarantined")]
    assert json.loads(store.read(f"{names.QUARANTINE}/{broken}.error.json"))["error"] == "RedriveExhausted"
    assert Reconciler(store, settings()).run().actions == [], "resolved: the cursor is past them all"

    # The job is the one the event path makes (name + ETag), and a late event for it changes nothing.
    job = Ledger(store).job(job_id_for(first_name, etags[first_name]))
    assert job is not None and job.shards_total == 2
    again = Ingestor(store, Settings.from_env()).ingest(first_name)
    assert again.job_id == job.job_id and Ledger(store).job(job.job_id).shards_total == 2


def test_a_young_upload_waits_for_its_event(store, feed):
    tag, now = uuid.uuid4().hex[:6], dt.datetime.now(dt.UTC)
    start_cursor(store, now)
    name = f"cf-{tag}/job.yaml"
    feed.append(now, [created(name, upload(store, name, sweep("young", 2)))])
    feed.consumable(now)
    assert Reconciler(store, settings(reconcile_grace_s=600)).run().actions == []
    assert redriven(Reconciler(store, settings()).run()) == [("missed_upload", f"incoming/{name}", "redriven")]


def test_the_first_pass_lists_and_an_account_without_a_feed_is_listed_every_pass(store):
    tag = uuid.uuid4().hex[:6]
    store.container(CONTAINER).delete_container()  # Azurite as it comes: no change feed
    name = f"cf-{tag}/job.yaml"
    upload(store, name, sweep("nofeed", 2))
    result = Reconciler(store, settings()).run()
    assert redriven(result) == [("missed_upload", f"incoming/{name}", "redriven")] and result.listed == 1
    assert "changefeed" not in Reconciler(store, settings()).state(), "no feed: no cursor"

    FeedWriter(store.container(CONTAINER))  # the feed is enabled: the first pass lists once and starts the cursor
    first = Reconciler(store, settings()).run()
    assert first.listed == 1 and first.actions == []
    state = Reconciler(store, settings()).state()
    expected = dt.datetime.fromtimestamp(state["watermark"], dt.UTC).replace(minute=0, second=0, microsecond=0) - HOUR
    assert state["changefeed"] == {"segment": segment_key(expected), "chunks": {}}
    assert Reconciler(store, settings()).run().listed == 0


def test_the_source_is_a_setting():
    assert Settings.from_env({}).reconcile_source == "listing"
    assert Settings.from_env({"UPWELL_RECONCILE_SOURCE": "changefeed"}).reconcile_source == "changefeed"
    with pytest.raises(ConfigError, match="UPWELL_RECONCILE_SOURCE"):
        Settings.from_env({"UPWELL_RECONCILE_SOURCE": "eventgrid"})
