"""How a Parquet drop's row groups become shards (upwell.ingest.parquetshards.group_rows), and the row-group
reference's JSON form (upwell.shardref): pure, no storage."""

from __future__ import annotations

import pytest

from upwell.errors import DecodeError
from upwell.ingest.parquetshards import group_rows
from upwell.shardref import ShardRef


def test_consecutive_row_groups_fill_a_shard_and_a_larger_one_is_a_shard_alone():
    # 10+10 fit in 20; 30 is more than 20 on its own; 0-row groups ride along; 5+5 fit
    assert list(group_rows([10, 10, 30, 0, 5, 5, 0], 20)) == [(0, 2, 20), (2, 3, 30), (3, 7, 10)]
    assert list(group_rows([25, 25], 20)) == [(0, 1, 25), (1, 2, 25)]
    assert list(group_rows([0, 0], 20)) == [] and list(group_rows([], 20)) == []


def test_a_row_group_reference_round_trips_and_a_byte_range_keeps_its_old_form():
    ref = ShardRef(0, 4096, '"0x1"', row_groups=(2, 5), rows=300)
    assert ShardRef.from_dict(ref.to_dict()) == ref and not ref.whole and list(ref.groups) == [2, 3, 4]
    assert ref.span == "row groups 2-4 (300 rows)"
    csv = ShardRef(10, 90, '"0x1"', header="a,b\n")
    assert "row_groups" not in csv.to_dict() and "rows" not in csv.to_dict() and csv.span == "bytes 10-100"


@pytest.mark.parametrize("groups", [[3], [3, 3], [-1, 2], [1, 2, 3]])
def test_bad_row_groups_are_a_decode_error(groups):
    with pytest.raises(DecodeError, match="row groups"):
        ShardRef.from_dict({"offset": 0, "length": 10, "etag": "e", "row_groups": groups, "rows": 1})
