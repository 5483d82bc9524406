"""A job waiting on a parent named before it was submitted looks the name up again, however often it is checked,
and a recheck that finds no parent never clears the parent id a wake-up set meanwhile.

The parent's end wakes its waiting children (``upwell.after.chains``); where that wake-up is lost, the scale
timer's pass over waiting jobs (``recheck_waiting``) ingests the child again, and its gate looks the parent's
name up at most once every ``NAME_LOOKUP_S``. A check inside that window skips the lookup and must leave the
time of the last lookup as it was: moved on at every check, it held the lookup off for good while checks came
more often than the window (a fresh clone's ``make test`` met it: the child waited past its 120 s).
"""

from __future__ import annotations

import time

from upwell import names
from upwell.after import gate
from upwell.ingest.ingestor import Ingestor
from upwell.ledger import Ledger
from upwell.rows import JobState
from upwell.settings import Settings

QUICK = "payload: logistic\nparams: {steps: 200, burn_in: 10}\ngrid: {r: [3.1]}\n"


def test_checks_inside_the_lookup_window_do_not_hold_off_the_next_lookup(store, monkeypatch):
    monkeypatch.setattr(gate, "NAME_LOOKUP_S", 2.0)
    ledger, ingestor = Ledger(store), Ingestor(store, Settings())
    tag = time.time_ns()
    child = f"lookup/{tag}-child/job.yaml"
    store.blob(names.INCOMING, child).upload_blob(f"name: child {tag}\n{QUICK}after: parent {tag}\n".encode())
    first = ingestor.ingest(child)
    assert first.status == "waiting", first  # the parent is not submitted yet: looked up, not found
    looked_at = float(ledger.job(first.job_id).extra["after_checked"])
    parent = f"lookup/{tag}-parent/job.yaml"
    store.blob(names.INCOMING, parent).upload_blob(f"name: parent {tag}\n{QUICK}".encode())
    parent_id = ingestor.ingest(parent).job_id
    time.sleep(1.0)
    assert ingestor.ingest(child).status == "waiting"  # inside the window: no lookup, and none recorded
    row = ledger.job(first.job_id)
    assert float(row.extra["after_checked"]) == looked_at and not row.extra.get("after_parent_id")
    time.sleep(1.5)  # 2.5 s since the lookup, 1.5 s since the last check
    assert ingestor.ingest(child).status == "waiting"  # the parent is found by its name; it has not ended
    row = ledger.job(first.job_id)
    assert row.status == JobState.WAITING and row.extra["after_parent_id"] == parent_id, row.message
    assert f"waiting for job {parent_id}" in row.message


def test_a_recheck_that_finds_no_parent_keeps_the_parent_id_a_wake_up_set_meanwhile(store):
    """The scale timer's recheck reads the child, the parent's end sets its ``after_parent_id`` (chains.wake),
    then the recheck, which found no parent, records that it still waits: it must not write "" over the id,
    or the wake-up's own ingest of the child finds no parent and the wake-up is lost."""
    ledger, ingestor = Ledger(store), Ingestor(store, Settings())
    tag = time.time_ns()
    child = f"lookup/{tag}-child2/job.yaml"
    store.blob(names.INCOMING, child).upload_blob(f"name: child2 {tag}\n{QUICK}after: parent2 {tag}\n".encode())
    job_id = ingestor.ingest(child).job_id
    read_by_the_recheck = ledger.job(job_id)
    ledger.update_job(job_id, after_parent_id="parent2-job")  # the wake-up, as chains.wake sets it
    gate._wait(ledger, {"job_id": job_id}, read_by_the_recheck, "", "still waiting", looked=False)
    assert ledger.job(job_id).extra["after_parent_id"] == "parent2-job"
