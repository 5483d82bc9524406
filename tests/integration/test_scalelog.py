"""The scaling log owns Table ``scaling``: typed rows in and out, the ETag claim, and the reconciler's rows."""

from __future__ import annotations

import uuid

import pytest

from upwell.scalelog import Action, DecisionRow, ScalingLog, fresh_reconcile_state
from upwell.storage import Storage


@pytest.fixture()
def log(azurite) -> ScalingLog:
    store = Storage(azurite.connection_string)
    store.ensure()
    return ScalingLog(store)


def pool() -> str:
    return f"p{uuid.uuid4().hex[:8]}"


def test_decisions_round_trip_in_time_order_and_within_the_window(log):
    name = pool()
    rows = [DecisionRow(name, f"2026-01-01T00:00:0{i}.000Z", target=i, nodes=i, busy=1, visible=2, in_flight=3,
                        reason=f"r{i}", capped_by="quota", spot=1, dedicated=i - 1, message="m")
            for i in (3, 1, 2)]
    for row in rows:
        log.record(row)
    log.claim_policy(name, {"votes": 1}, None)  # the state row is never a decision
    assert log.decisions(name) == sorted(rows, key=lambda r: r.at)
    assert [d.target for d in log.decisions(name, "2026-01-01T00:00:02")] == [2, 3]
    assert [d.target for d in log.decisions(name, "", "2026-01-01T00:00:02~")] == [1, 2]
    assert log.decisions(name)[0].backlog == 5


def test_a_decision_with_missing_properties_reads_as_zeros(log):
    name = pool()
    log.table.upsert_entity({"PartitionKey": name, "RowKey": "2026-01-01T00:00:00.000Z", "target": 4})
    (row,) = log.decisions(name)
    assert (row.target, row.nodes, row.backlog, row.reason) == (4, 0, 0, "")


def test_policy_claim_is_won_once_per_read(log):
    name = pool()
    assert log.policy(name) is None
    assert log.claim_policy(name, {"votes": 1}, None)
    assert not log.claim_policy(name, {"votes": 9}, None)  # another run created it first
    row = log.policy(name)
    assert row.state == {"votes": 1}
    assert log.claim_policy(name, {"votes": 2}, row.etag)
    assert not log.claim_policy(name, {"votes": 3}, row.etag)  # the ETag it read is stale now
    assert log.policy(name).state == {"votes": 2}


@pytest.mark.parametrize("stored", ["not json", "[1, 2]"])
def test_an_unreadable_policy_state_reads_empty_and_keeps_its_etag(log, stored):
    name = pool()
    log.table.upsert_entity({"PartitionKey": name, "RowKey": "state", "state": stored})
    row = log.policy(name)
    assert row.state == {} and row.etag
    assert log.claim_policy(name, {"votes": 1}, row.etag)


def test_reconcile_state_and_actions(log):
    log.table.delete_entity("_reconcile", "state")  # no row: a fresh state
    assert log.reconcile_state() == fresh_reconcile_state() == {"watermark": 0.0, "redrives": {}}
    log.save_reconcile_state({"watermark": 5.0, "redrives": {"a": 1}})
    assert log.reconcile_state() == {"watermark": 5.0, "redrives": {"a": 1}}
    first = Action("missed_upload", "incoming/a", "redriven", at="9999-01-01T00:00:01")  # newer than any real pass's
    second = Action("poison", "incoming/b", "failed", "x" * 5000, at="9999-01-01T00:00:02")
    log.record_action(first)
    log.record_action(second)
    newest = log.actions(limit=2)
    assert [a.target for a in newest] == ["incoming/b", "incoming/a"]
    assert len(newest[0].detail) == 4000 and newest[1] == first
    for row in log.table.query_entities("PartitionKey eq '_reconcile' and RowKey ge '9999'"):
        log.table.delete_entity(row["PartitionKey"], row["RowKey"])  # the session's Azurite is shared
