"""The estimate and the accounting multiply by nodes (issue 22): at one node and at two.

An estimate of a k-node shard is k x one node's seconds x price x the share of a node (ranks per node over
its cores); a finished attempt's node-seconds are its time x the nodes it held, which the ledger sums and
accounting prices; learning divides them by the nodes again, so a learned figure is one node's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from upwell import cost
from upwell.cost import accounting
from upwell.cost import forecast as est
from upwell.messages import WorkItem
from upwell.rows import JobRow, JobState, ShardRow, ShardState
from upwell.settings import Settings
from workers import results, settle

KEY = "Standard_D32s_v4"  # 32 vCPUs, $2.5/h pay-as-you-go


@pytest.mark.parametrize("nodes, ranks, node_seconds, share", [
    (1, 16, 3600.0, 16 / 32),
    (2, 32, 2 * 3600.0, 16 / 32),  # 16 ranks on each node: the same share of each, twice the nodes
    (2, 64, 2 * 3600.0, 1.0),
])
def test_estimate_multiplies_by_nodes(nodes, ranks, node_seconds, share):
    e = est.estimate([{"a": 1}], history=est.History(), manifest_s=3600.0, price_key=KEY, spot_allowed=False,
                     pool_spot_share=0.0, ranks=ranks, nodes=nodes)
    assert e.node_seconds == pytest.approx(node_seconds)
    assert e.share == pytest.approx(share)
    assert e.usd == pytest.approx(nodes * 1.0 * 2.5 * share)  # nodes x node-hours x price x share


def test_two_shards_of_two_nodes_cost_twice_two_of_one():
    one = est.estimate([{"a": 1}, {"a": 2}], history=est.History(), manifest_s=600.0, price_key=KEY,
                       spot_allowed=False, pool_spot_share=0.0, ranks=32, nodes=1)
    two = est.estimate([{"a": 1}, {"a": 2}], history=est.History(), manifest_s=600.0, price_key=KEY,
                       spot_allowed=False, pool_spot_share=0.0, ranks=64, nodes=2)
    assert two.usd == pytest.approx(2 * one.usd) and two.node_seconds == pytest.approx(2 * one.node_seconds)


class FakeLedger:
    """The two reads learn() makes: the jobs that ended last, and a page of their shard rows."""

    def __init__(self, job: JobRow, rows: list[ShardRow]):
        self.row, self.rows, self.index = job, rows, self

    def job(self, job_id):
        return self.row

    def last_ended(self, read, limit):
        return iter([read(self.row.job_id)])

    def shard_page(self, job_id, after="", limit=100):
        return self.rows[:limit], ""


@pytest.mark.parametrize("nodes", [1, 2])
def test_learning_keeps_one_nodes_seconds(nodes):
    """A gang's recorded node-seconds (time x nodes) are learned per node; the estimate multiplies again."""
    job = JobRow(job_id="j", status=JobState.SUCCEEDED, ranks=2 * nodes, nodes=nodes, finished_at="x", payload="p",
                 pool="mpi")
    rows = [ShardRow(job_id="j", shard_id="s", status=ShardState.SUCCEEDED, params='{"a": 1}',
                     node_seconds=300.0 * nodes)]
    hist = est.learn(FakeLedger(job, rows), "p", "mpi")
    assert hist.all == [300.0]
    e = est.estimate([{"a": 1}], history=hist, manifest_s=300.0, price_key=KEY, spot_allowed=False,
                     pool_spot_share=0.0, ranks=2 * nodes, nodes=nodes)
    assert e.node_seconds == pytest.approx(300.0 * nodes) and "learned" in e.basis


def test_size_key_of_one_node_is_unchanged():
    """Keys learned before gangs existed still match a one-node shard."""
    assert est.size_key({"a": 1}, 4, 0) == est.size_key({"a": 1}, 4, 0, 1) != est.size_key({"a": 1}, 4, 0, 2)


@pytest.mark.parametrize("nodes", [1, 2])
def test_result_node_seconds_are_time_times_nodes(nodes):
    item = WorkItem(job_id="j", shard_id="s", payload="p", pool="mpi", nodes=nodes, ranks=2 * nodes)
    doc = results.document(item, "succeeded", shard=ShardRow(job_id="j", shard_id="s"), job=JobRow(job_id="j"),
                           node={"id": "n1"}, started="2026-12-03T08:00:00.000Z", finished="2026-12-03T08:10:00.000Z",
                           settings=Settings(), cpu_wait_s=60.0)
    assert doc["timings"]["node_seconds"] == pytest.approx((600.0 - 60.0) * nodes)
    assert doc["timings"]["nodes"] == nodes


@pytest.mark.parametrize("nodes", [1, 2])
def test_settled_attempt_node_seconds_are_time_times_nodes(nodes):
    """Preempted and failed attempts: the same product, as the agent hands it to the ledger."""
    hand = SimpleNamespace(item=WorkItem(job_id="j", shard_id="s", payload="p", pool="mpi", nodes=nodes), started=None,
                           staging_wait_s=5.0)
    assert settle.node_seconds(hand, SimpleNamespace(run_s=125.0, cpu_wait_s=0.0)) == pytest.approx(120.0 * nodes)


@pytest.mark.parametrize("nodes", [1, 2])
def test_accounting_prices_the_summed_node_seconds(nodes):
    """The ledger's node-seconds already hold the nodes; the price and the share of a node do the rest."""
    job = JobRow(job_id="j", price_key=KEY, nodes=nodes, node_share=0.5)
    row = ShardRow(job_id="j", shard_id="s", node_seconds=3600.0 * nodes, preempted_node_seconds=0.0)
    assert accounting.shard_cost(row, job) == pytest.approx(nodes * 2.5 * 0.5)
    assert cost.paid_seconds({"node_seconds": 3600.0 * nodes}) == pytest.approx(3600.0 * nodes)
