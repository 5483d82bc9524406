"""Work item encoding: versioned JSON, the 64 KiB limit, typed decode errors."""

import base64
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from upwell.errors import DecodeError, InputRejected
from upwell.messages import MAX_MESSAGE_BYTES, WorkItem, decode, encode

ITEM = WorkItem(job_id="j-1", shard_id="s00001", payload="logistic", pool="cpu", params={"r": 3.5},
                input_blob="shards/j-1/s00001.csv", checkpoint_prefix="checkpoints/j-1/s00001/",
                result_prefix="results/j-1/s00001")


def test_round_trip_plain_and_base64():
    text = encode(ITEM)
    assert decode(text) == ITEM
    assert decode(base64.b64encode(text.encode()).decode()) == ITEM
    assert decode(text.encode()) == ITEM


def test_size_limit_names_the_limit():
    big = WorkItem(**{**ITEM.__dict__, "params": {"blob": "x" * MAX_MESSAGE_BYTES}})
    with pytest.raises(InputRejected) as err:
        encode(big)
    assert "65536" in str(err.value) and err.value.field == "params"


@pytest.mark.parametrize("bad, why", [
    ("not json", "not JSON"),
    ("[1, 2]", "not a JSON object"),
    (json.dumps({"job_id": "j"}), "lacks"),
    (json.dumps({**json.loads(encode(ITEM)), "schema": 99}), "schema 99"),
    (json.dumps({**json.loads(encode(ITEM)), "command": "rm -rf /"}), "unknown fields"),
    ("\udcff", "not JSON"),
])
def test_decode_errors_are_typed(bad, why):
    with pytest.raises(DecodeError, match=why):
        decode(bad)


@given(params=st.dictionaries(st.text(max_size=20), st.one_of(st.integers(), st.floats(allow_nan=False),
                                                              st.text(max_size=50), st.booleans()), max_size=10),
       attempt=st.integers(1, 100), shard=st.from_regex(r"s[0-9]{5}", fullmatch=True))
def test_round_trip_property(params, attempt, shard):
    item = WorkItem(job_id="job", shard_id=shard, payload="logistic", pool="cpu", params=params, attempt=attempt)
    assert decode(encode(item)) == item


TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                       | TEXT, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
                       max_leaves=20)


@given(job=TEXT, shard=TEXT, payload=TEXT, pool=TEXT, params=st.dictionaries(TEXT, JSONISH, max_size=6),
       blob=st.none() | TEXT, prefix=TEXT, trace=TEXT, ranks=st.integers(1, 1024), gpus=st.integers(0, 16))
def test_round_trip_every_field(job, shard, payload, pool, params, blob, prefix, trace, ranks, gpus):
    """Any text in any field (quotes, newlines, non-ASCII) and nested parameters survive the codec."""
    item = WorkItem(job_id=job, shard_id=shard, payload=payload, pool=pool, params=params, input_blob=blob,
                    checkpoint_prefix=prefix, result_prefix=prefix, trace_id=trace, ranks=ranks, gpus=gpus)
    text = encode(item)
    assert decode(text) == item and decode(base64.b64encode(text.encode()).decode()) == item
