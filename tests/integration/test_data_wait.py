"""Upload order, on Azurite: a manifest that arrives before its data/ files waits for them (visible as
"waiting" in `upwell status`), goes on when the last one lands, and is rejected with the missing names
once its grace is over."""

from __future__ import annotations

from typer.testing import CliRunner

from upwell import logs, names
from upwell.cli import app
from upwell.ingest.ingestor import Ingestor, recheck_waiting
from upwell.ledger import Ledger
from upwell.settings import Settings
from upwell.storage import Storage

runner = CliRunner()
logs.configure()
MANIFEST = b"name: {name}\npayload: channel-stats\ndata: [data/a.csv, data/b.csv]\nshard: {{rows: 2}}\n"
CSV = b"time,x\n0.1,1\n0.2,2\n0.3,3\n"


def _put(store: Storage, name: str, data: bytes) -> None:
    store.blob(names.INCOMING, name).upload_blob(data, overwrite=True)


def test_manifest_first_waits_then_runs_when_the_data_lands(store):
    ingest = Ingestor(store, Settings(data_wait_s=600))
    ledger = Ledger(store)
    _put(store, "order/first/job.yaml", MANIFEST.replace(b"{name}", b"order-first").replace(b"{{", b"{")
         .replace(b"}}", b"}"))
    out = ingest.ingest("order/first/job.yaml")
    assert out.status == "waiting", out
    job = ledger.job(out.job_id)
    assert job.status == "waiting" and "data/a.csv, data/b.csv (0 of 2 present)" in job.message, job
    code, text = runner.invoke(app, ["status"]).exit_code, runner.invoke(app, ["status", "order-first"]).output
    assert code == 0 and "waiting" in text and "gives up at" in text, text

    _put(store, "order/first/data/a.csv", CSV)
    assert ingest.ingest("order/first/data/a.csv").status == "skipped"  # an input: it only wakes the manifest
    assert "(1 of 2 present)" in ledger.job(out.job_id).message
    assert ledger.job(out.job_id).status == "waiting"

    _put(store, "order/first/data/b.csv", CSV)
    ingest.ingest("order/first/data/b.csv")
    job = ledger.job(out.job_id)
    assert job.status == "accepted" and job.shards_total == 4 and job.payload == "channel-stats", job
    assert not job.message
    assert len(ledger.shards(out.job_id)) == 4
    # A later delivery of the manifest is the same job, not a second one.
    assert ingest.ingest("order/first/job.yaml").status == "duplicate"


def test_a_waiting_manifest_is_rejected_when_its_grace_is_over(store):
    ledger = Ledger(store)
    _put(store, "order/late/job.yaml", b"payload: channel-stats\ndata: [data/a.csv, data/never.csv]\n")
    _put(store, "order/late/data/a.csv", CSV)
    out = Ingestor(store, Settings(data_wait_s=600)).ingest("order/late/job.yaml")
    assert out.status == "waiting" and "data/never.csv (1 of 2 present)" in out.message
    assert out.job_id in recheck_waiting(store, Settings(data_wait_s=0))  # the timer, once the grace is over
    job = ledger.job(out.job_id)
    assert job.status == "rejected", job
    assert "order/late/data/never.csv does not exist" in job.message and "the limit is 0 s" in job.message
    assert store.exists(f"{names.QUARANTINE}/order/late/job.yaml.error.json")
