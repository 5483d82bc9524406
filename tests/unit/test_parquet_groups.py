"""How a Parquet drop's row groups become shards (upwell.ingest.parquetshards.group_rows), and the row-group
reference's JSON form (upwell.shardref): pure, no storage."""

from __future__ import annotations

import pytest

from upwell.errors import DecodeError, InputRejected
from upwell.ingest.parquetshards import group_rows
from upwell.shardref import ShardRef


def test_consecutive_row_groups_fill_a_shard_and_a_larger_one_is_a_shard_alone():
    # 10+10 fit in 20; 30 is more than 20 on its own; 0-row groups ride along; 5+5 fit
    assert list(group_rows([10, 10, 30, 0, 5, 5, 0], 20)) == [(0, 2, 20), (2, 3, 30), (3, 7, 10)]
    assert list(group_rows([25, 25], 20)) == [(0, 1, 25), (1, 2, 25)]
    assert list(group_rows([0, 0], 20)) == [] and list(group_rows([], 20)) == []


def test_a_byte_limit_groups_by_stored_size_and_either_limit_cuts():
    # sizes 40+40 fit in 100, +40 does not; a 150-byte group is a shard alone; rows alone would make one shard
    assert list(group_rows([5, 5, 5, 5], None, [40, 40, 40, 150], 100)) == [(0, 2, 10), (2, 3, 5), (3, 4, 5)]
    assert list(group_rows([5, 5, 5, 5], 100, [40, 40, 40, 150], None)) == [(0, 4, 20)]
    assert list(group_rows([5, 5, 5, 5], 8, [40, 40, 40, 150], 1000)) == [(0, 1, 5), (1, 2, 5), (2, 3, 5), (3, 4, 5)]


def test_the_cuts_of_a_real_footer_follow_its_compressed_sizes(tmp_path):
    """A file of 8 row groups of 1,000 random floats (about 8 KB stored each): a 20 KB limit takes two a
    shard, and ``local_shards`` (what submit counts) is the number those cuts make; a limit on rows still works."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from upwell.ingest.parquetshards import _footer, cuts, local_shards

    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"x": np.random.default_rng(1).random(8000)}), path, row_group_size=1000)
    meta = _footer(path, "d")
    size = meta.row_group(0).column(0).total_compressed_size
    assert 7000 < size < 10_000, size
    assert cuts(meta, None, 20_000, source="d", max_shards=100) == [(0, 2, 2000), (2, 4, 2000), (4, 6, 2000),
                                                                     (6, 8, 2000)]
    assert local_shards(path, source="d", rows_per_shard=None, bytes_per_shard=20_000) == 4
    assert local_shards(path, source="d", rows_per_shard=3000) == 3  # 3 + 3 + 2 row groups
    assert local_shards(path, source="d", rows_per_shard=None, bytes_per_shard=None) == 8  # 1,000 rows a shard
    with pytest.raises(InputRejected, match="makes more than 3 shards"):
        local_shards(path, source="d", rows_per_shard=1000, max_shards=3)


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
