"""The per-job concurrency cap (manifest ``max_concurrency`` / UPWELL_MAX_CONCURRENCY), end to end.

Four agents (spawned by the scale timer) share a job capped at two running shards. The agents
that find the job at its cap put the message back with a short delay and count a deferral on the
shard row, never a failure: with maxDequeueCount 2, shards deferred again and again still run.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from tests.faults import harness
from upwell import names
from upwell.ledger import JobRow, Ledger
from upwell.settings import Settings

SHARDS, CAP = 12, 2


def max_overlap(intervals: list[tuple[datetime, datetime]]) -> int:
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals], key=lambda e: (e[0], e[1]))
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def test_cap_from_manifest_holds_and_deferrals_never_poison(tmp_path: Path, monkeypatch):
    emulator = harness.start_azurite(tmp_path)
    try:
        env = harness.environment(tmp_path, emulator.connection_string, UPWELL_POOLS=harness.pools(4),
                                  UPWELL_MAX_DEQUEUE_COUNT="2")
        harness.apply_env(monkeypatch, env)
        stack = harness.Stack(tmp_path, emulator, env)
        stack.storage.ensure()
        manifest = yaml.safe_dump({"payload": "logistic", "max_concurrency": CAP,
                                   "params": {"steps": 10, "burn_in": 0, "sleep_s": 0.5},
                                   "grid": {"r": harness.r_values(SHARDS)}}).encode()
        with harness.in_process_host(stack):
            job_id = harness.upload(stack.storage, "cap/job.yaml", manifest)
            job = harness.wait_reported(stack.storage, job_id, 150)
        harness.no_orphans(stack)
        ledger = Ledger(stack.storage)
        rows = ledger.shards(job_id)
        assert job.status == "succeeded" and int(job.max_concurrency) == CAP
        assert all(r.status == "succeeded" and not int(r.failures or 0) for r in rows)
        deferrals = [int(r.deferrals or 0) for r in rows]
        assert sum(deferrals) >= SHARDS // 2, deferrals
        assert max(deferrals) >= 2, f"no shard was deferred past maxDequeueCount: {deferrals}"
        docs = [json.loads(stack.storage.read(f"{names.RESULTS}/{job_id}/{r.shard_id}.json")) for r in rows]
        spans = [(datetime.fromisoformat(d["timings"]["started"].replace("Z", "+00:00")),
                  datetime.fromisoformat(d["timings"]["finished"].replace("Z", "+00:00"))) for d in docs]
        assert max_overlap(spans) <= CAP
        assert max(d["timings"]["attempt"] for d in docs) > 2  # delivered past maxDequeueCount, not poisoned
        assert harness.queue_count(stack.storage, names.poison_queue(names.work_queue("cpu"))) == 0
    finally:
        harness.close_workers(harness.Stack(tmp_path, emulator, harness.environment(tmp_path, "")))
        emulator.stop()


def test_cap_setting_is_read_and_checked():
    assert Settings().max_concurrency == 0  # no cap unless asked
    assert Settings.from_env({"UPWELL_MAX_CONCURRENCY": "3"}).max_concurrency == 3
    with pytest.raises(Exception, match="UPWELL_MAX_CONCURRENCY must be >= 0"):
        Settings.from_env({"UPWELL_MAX_CONCURRENCY": "-1"})


@pytest.mark.parametrize("job_cap, setting, want", [(0, 0, 0), (3, 0, 3), (0, 4, 4), (3, 4, 3), (5, 2, 2)])
def test_the_lower_cap_wins(job_cap, setting, want):
    from upwell.verdict import concurrency_cap

    assert concurrency_cap(JobRow(max_concurrency=job_cap), Settings(max_concurrency=setting).max_concurrency) == want
