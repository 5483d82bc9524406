"""Issue 24, item 4: the report of a big job shows a bounded shard table and keeps every shard in shards.csv;
what the figures modules do per shard grows with the shards, not with their square."""

from __future__ import annotations

import csv
import io

from upwell.results.figures._common import missing_note
from upwell.results.report import table


def rows(n: int, failed: set[int] = frozenset()) -> list[dict]:
    return [{"shard_id": f"s{i:05d}", "status": "failed" if i in failed else "succeeded", "run_s": float(i % 97),
             "params": {"r": i / 10}, "metrics": {"x": i} if i not in failed else {}} for i in range(n)]


def test_a_small_job_shows_every_shard_in_order():
    some = rows(30, {3})
    assert table.shown(some, 1000) is some


def test_a_big_job_shows_the_failed_then_the_slowest_in_shard_order():
    many = rows(5000, {7, 4000})
    picked = table.shown(many, 100)
    assert len(picked) == 100
    assert {"s00007", "s04000"} <= {r["shard_id"] for r in picked}
    assert [r["shard_id"] for r in picked] == sorted(r["shard_id"] for r in picked)
    ids = {id(r) for r in picked}
    slowest_left_out = max(r["run_s"] for r in many if id(r) not in ids)
    assert all(r["run_s"] >= slowest_left_out for r in picked if r["status"] != "failed")


def test_shards_csv_holds_every_shard_with_its_params_and_metrics():
    many = rows(2500, {1})
    text = table.to_csv(many).decode()
    read = list(csv.DictReader(io.StringIO(text)))
    assert len(read) == 2500 and read[0]["shard_id"] == "s00000"
    assert read[1]["status"] == "failed" and read[1]["metric.x"] == "" and read[2]["metric.x"] == "2"
    assert read[2]["param.r"] == "0.2" and read[2]["run_s"] == "2.0"


class Doc(dict):
    """A result document that counts how often it is compared whole (``==``)."""

    compared = 0

    def __eq__(self, other):
        Doc.compared += 1
        return dict.__eq__(self, other)

    __hash__ = None


def test_the_missing_note_compares_no_documents():
    docs = [Doc(shard_id=f"s{i:05d}", metrics={"x": i}) for i in range(2000)]
    ok = docs[::2]
    Doc.compared = 0
    note = missing_note(docs, ok)
    assert note.startswith("1000 of 2000 shards") and "s00001" in note
    assert Doc.compared == 0  # by identity: comparing whole documents made it O(n²) in the shards
