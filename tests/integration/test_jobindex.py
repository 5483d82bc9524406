"""The ledger's index of open jobs (upwell.jobindex) on Azurite: it follows every job status the ledger
writes, and the readers mend what a crash between the two writes leaves behind."""

from __future__ import annotations

import uuid

from upwell import jobindex, names
from upwell.ledger import JobRow, JobState, Ledger, ShardRow, ShardState


def _open_ids(ledger: Ledger) -> set[str]:
    return {j.job_id for j in ledger.open_jobs()}


def _entries(store, job_id: str) -> list[str]:
    table = store.table(names.JOB_INDEX_TABLE)
    return [e["RowKey"].split("-", 1)[0] for e in table.query_entities("PartitionKey eq @pk and job_id eq @j",
                                                                        parameters={"pk": jobindex.PARTITION,
                                                                                    "j": job_id})]


def _job(ledger: Ledger, status: JobState = JobState.ACCEPTED) -> str:
    job_id = f"idx-{uuid.uuid4().hex[:10]}"
    ledger.create_job(JobRow(job_id=job_id, status=status, pool="cpu", shards_total=1, created_at="2099-01-01"))
    ledger.add_shards(job_id, [ShardRow(job_id=job_id, shard_id="s00000", pool="cpu")])
    return job_id


def test_the_index_follows_a_job_from_open_to_ended_and_back(store):
    ledger = Ledger(store)
    job_id = _job(ledger)
    assert job_id in _open_ids(ledger) and _entries(store, job_id) == ["open"]
    done = ledger.finish_shard(job_id, "s00000", ShardState.SUCCEEDED, {})
    assert done.job_done and job_id not in _open_ids(ledger) and _entries(store, job_id) == ["ended"]
    assert job_id in {j.job_id for j in ledger.recent_jobs(5)}  # the newest created, ended last
    assert job_id in {j.job_id for j in ledger.ended_jobs(60)}  # the scale timer's report fallback
    ledger.change_job(job_id, lambda row: {"status": JobState.ACCEPTED})  # a re-run reopens it
    assert job_id in _open_ids(ledger)
    cancelled = _job(ledger)
    ledger.change_job(cancelled, lambda row: {"status": JobState.CANCELLED})
    ledger.update_job(job_id, status=JobState.REJECTED)
    assert not {job_id, cancelled} & _open_ids(ledger)
    assert {j.job_id for j in ledger.open_jobs(JobState.RUNNING)} & {job_id, cancelled} == set()
    ledger.delete_job(cancelled)
    ledger.recent_jobs(50)  # a reader meets the deleted job's ended entry and drops it
    assert _entries(store, cancelled) == []


def test_readers_mend_what_a_crash_left(store, monkeypatch):
    ledger = Ledger(store)
    stale = _job(ledger)  # its row ended behind the ledger's back: the entry says open
    ledger.table.update_entity({"PartitionKey": stale, "RowKey": names.JOB_ROW, "status": "succeeded"})
    orphan = f"idx-{uuid.uuid4().hex[:10]}"  # an entry whose job row never came
    ledger.index.moved(orphan, JobState.INGESTING)
    missing = f"idx-{uuid.uuid4().hex[:10]}"  # a job row without its entry (older than the index)
    ledger.table.create_entity(JobRow(job_id=missing, status=JobState.RUNNING, pool="cpu").to_entity())
    assert not {stale, orphan, missing} & _open_ids(ledger)
    assert _entries(store, stale) == ["ended"] and _entries(store, orphan) == ["open"]  # within its grace
    monkeypatch.setattr(jobindex, "GRACE_S", -1.0)
    ledger.open_jobs()
    assert _entries(store, orphan) == []
    assert ledger.index.add_missing([ledger.job(missing), ledger.job(stale)]) == 1  # the backfill (upwell.jobcatalog)
    assert missing in _open_ids(ledger) and stale not in _open_ids(ledger)


def _listed(ledger: Ledger, job_id: str) -> dict:
    (entry,) = [e for e in ledger.catalog.entries(name=job_id) if e.job_id == job_id]
    return {"status": entry.status, "ended": bool(entry.ended_at), "project": entry.project}


def test_the_catalogue_follows_the_job_and_listings_confirm_its_hints(store):
    ledger = Ledger(store)
    job_id = f"cat-{uuid.uuid4().hex[:10]}"
    ledger.create_job(JobRow(job_id=job_id, name=job_id, project="lab", status=JobState.ACCEPTED, pool="cpu",
                             shards_total=1, created_at="2099-01-01"))
    ledger.add_shards(job_id, [ShardRow(job_id=job_id, shard_id="s00000", pool="cpu")])
    assert _listed(ledger, job_id) == {"status": "accepted", "ended": False, "project": "lab"}
    ledger.shard_started(job_id, "s00000", node="n1", pool="cpu", attempt=1)  # accepted -> running: not indexed
    assert _listed(ledger, job_id)["status"] == "accepted"
    assert [j.job_id for j in ledger.jobs(JobState.RUNNING, name=job_id)] == [job_id]  # the row decides
    assert [j.job_id for j in ledger.jobs(JobState.ACCEPTED, name=job_id)] == []
    ledger.finish_shard(job_id, "s00000", ShardState.SUCCEEDED, {})
    assert _listed(ledger, job_id) == {"status": "succeeded", "ended": True, "project": "lab"}
    ledger.change_job(job_id, lambda row: {"status": JobState.ACCEPTED})  # a re-run
    assert _listed(ledger, job_id) == {"status": "accepted", "ended": False, "project": "lab"}
    ledger.delete_job(job_id)
    assert ledger.catalog.entries(name=job_id) == []


def test_a_crash_while_reopening_leaves_an_entry_the_readers_mend_never_an_open_job_without_one(store, monkeypatch):
    ledger = Ledger(store)
    job_id = _job(ledger)
    ledger.finish_shard(job_id, "s00000", ShardState.SUCCEEDED, {})

    def crash(*args, **kwargs):
        raise RuntimeError("the process died before the job row was written")

    monkeypatch.setattr(ledger.table, "update_entity", crash)
    try:
        ledger.change_job(job_id, lambda row: {"status": JobState.ACCEPTED})
    except RuntimeError:
        pass
    monkeypatch.undo()
    assert _entries(store, job_id) == ["ended", "open"]  # the open entry came first; the row still says ended
    assert job_id not in _open_ids(ledger)  # a reader meets the entry its row contradicts and mends it
    assert _entries(store, job_id) == ["ended", "ended"]
