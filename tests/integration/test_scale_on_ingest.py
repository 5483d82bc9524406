"""Ingest nudges the scaler: with UPWELL_SCALE_ON_INGEST a local worker starts as soon as work is enqueued,
without waiting for the scale timer; without it, ingest starts nothing (tests that drive ingest alone)."""

from __future__ import annotations

import time

import pytest

from tests.pipeline_helpers import module_azurite, pipeline_env
from upwell import names
from upwell.local.devhost.app import load_functions
from upwell.pools.process import LocalPool
from upwell.settings import Settings
from upwell.storage import Storage

JOB = b"payload: logistic\nparams: {steps: 20, burn_in: 5}\ngrid: {r: [3.1]}\n"


# The nudge's scale pass counts every job on its pool: only this module's jobs may be there.
azurite = module_azurite("nudge")


def _ingest(store: Storage, name: str) -> None:
    store.blob(names.INCOMING, name).upload_blob(JOB, overwrite=True)
    fn = {s.name: s for s in load_functions("function_app:app")}["ingest"].func
    fn(store.blob(names.INCOMING, name))  # the SDK-type binding: a BlobClient, nothing downloaded first


@pytest.mark.parametrize("nudge", [True, False])
def test_ingest_starts_a_worker_only_when_told(azurite, tmp_path, monkeypatch, nudge):
    store = Storage(azurite.connection_string)
    store.ensure()
    store.queue(names.work_queue("cpu")).clear_messages()
    env = pipeline_env(monkeypatch, azurite.connection_string, tmp_path,
                       UPWELL_SCALE_SCHEDULE="0 0 0 1 1 *",  # the timer would not fire within the test
                       UPWELL_SCALE_ON_INGEST="1" if nudge else "0")
    pool = LocalPool(Settings.from_env(env).pools["cpu"], tmp_path)
    try:
        started = time.monotonic()
        _ingest(store, f"nudge/{nudge}-{time.time_ns()}/job.yaml")
        workers = pool.status().nodes
        if nudge:
            assert len(workers) == 1, workers  # spawned by the ingest call itself
            assert time.monotonic() - started < 30
        else:
            assert workers == {}
    finally:
        pool.close()
        store.queue(names.work_queue("cpu")).clear_messages()
