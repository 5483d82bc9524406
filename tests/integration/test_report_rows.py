"""Issue 24 item 5: the report takes each shard's result from its row, where collect keeps a compact copy, and
GETs the result blob only for a row without one; the report is the same either way."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from tests.pipeline_helpers import ingest_manifest
from upwell import names
from upwell.ledger import Ledger
from upwell.results import publish
from upwell.results.collect import ROW_RESULT_CHARS, collect, row_result
from upwell.results.report import build_report, summary
from upwell.settings import Settings
from upwell.storage import Storage
from workers.agent import Agent, AgentConfig

SHARDS = 4


def _report(store: Storage, ledger: Ledger, job_id: str, reads: list[str]) -> dict[str, bytes]:
    """The report's files as gather and build_report make them, with the result blobs gather read in ``reads``
    (the build time is fixed by the test)."""
    reads.clear()
    job, shards, results, events = publish.gather(store, ledger, job_id)
    return build_report(job, shards, results, events, fetch=store.read)


class _Fixed(datetime):
    @classmethod
    def now(cls, tz=None):
        return datetime(2026, 1, 2, 3, 4, 5, tzinfo=tz)


def test_the_report_reads_results_from_the_rows_and_the_blob_only_where_a_row_has_none(store, tmp_path: Path,
                                                                                      monkeypatch):
    ledger = Ledger(store)
    job = ingest_manifest(store, "rows/report/job.yaml", "payload: logistic\ngrid: {r: [3.1, 3.2, 3.3, 3.4]}\n")
    agent = Agent(store, AgentConfig(pool="cpu", node_id="rows-1", scratch=str(tmp_path), poll_s=0.1, slots=4,
                                     max_items=SHARDS, idle_exit_s=10), Settings())
    assert agent.run() == 0
    assert all(collect(store, f"{job}/s0000{i}.json").counted for i in range(SHARDS))
    rows = ledger.shards(job)
    blobs = {r.shard_id: json.loads(store.read(f"{names.RESULTS}/{job}/{r.shard_id}.json")) for r in rows}
    assert all(json.loads(r.result_json) == blobs[r.shard_id] for r in rows)  # the same document, compact

    reads: list[str] = []
    real_read = Storage.read

    def counting(self, path, *args, **kw):
        if path.startswith(f"{names.RESULTS}/"):
            reads.append(path)
        return real_read(self, path, *args, **kw)

    monkeypatch.setattr(Storage, "read", counting)
    monkeypatch.setattr(summary, "datetime", _Fixed)  # the report's "generated" time: the same for both builds
    from_rows = _report(store, ledger, job, reads)
    assert reads == []  # small results: no GET of a result blob
    # rows without a copy (a result too long to keep, a row collected before copies were kept): the same rows
    # otherwise, so that only where the results come from differs
    kept, bare = publish._kept, {"s00000", "s00001"}
    monkeypatch.setattr(publish, "_kept", lambda row: None if row.shard_id in bare else kept(row))
    assert _report(store, ledger, job, reads) == from_rows
    assert sorted(reads) == [f"{names.RESULTS}/{job}/s0000{i}.json" for i in range(2)]


def test_a_result_too_long_for_a_property_is_not_kept_on_the_row():
    small = {"status": "succeeded", "metrics": {"x": 1.5}, "note": "caf\u00e9"}
    assert json.loads(row_result(small)) == small and row_result(small).isascii()  # one char, one UTF-16 unit
    assert row_result({"blob": "x" * ROW_RESULT_CHARS}) == ""
    assert row_result({"set": {1}}) == ""  # not JSON: the blob stays the only copy
