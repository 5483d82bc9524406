"""Work item encoding: versioned JSON, the 64 KiB limit, typed decode errors, the shard row's ETag carried compact."""

import base64
import json
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from upwell.errors import DecodeError, InputRejected
from upwell.ingest.accept import _Items
from upwell.messages import MAX_MESSAGE_BYTES, WorkItem, compact_etag, decode, encode, expand_etag

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


ROW_ETAG = "W/\"datetime'2026-12-03T22%3A18%3A17.1785477Z'\""


def test_the_row_etag_travels_compact_and_comes_back_whole():
    item = WorkItem(**{**ITEM.__dict__, "row_etag": ROW_ETAG, "queued_at": "2026-12-03T22:18:17.170Z"})
    data = json.loads(encode(item))
    assert data["row_etag"] == "2026-12-03T22:18:17.1785477Z" and compact_etag(ROW_ETAG) == data["row_etag"]
    assert decode(encode(item)) == item and decode(encode(item)).row_etag == ROW_ETAG
    for other in ('"0x8DCA1B2C3D4E5F6"', 'W/"abc"', "W/\"datetime'2026-12-03T22:18:17Z'\""):  # kept whole
        assert compact_etag(other) == other and decode(encode(WorkItem(**{**ITEM.__dict__, "row_etag": other}))
                                                      ).row_etag == other


def test_an_item_without_a_row_etag_is_encoded_and_decoded_as_before():
    data = json.loads(encode(ITEM))
    assert "row_etag" not in data and "queued_at" not in data
    assert decode(json.dumps(data)) == ITEM and decode(json.dumps(data)).row_etag == ""


@pytest.mark.parametrize("field, value, why", [("row_etag", 7, "row_etag is not a string"),
                                               ("queued_at", ["x"], "queued_at is not a string")])
def test_a_row_field_of_the_wrong_type_is_a_decode_error(field, value, why):
    with pytest.raises(DecodeError, match=why):
        decode(json.dumps({**json.loads(encode(ITEM)), field: value}))


def test_a_row_etag_that_is_no_entity_tag_is_refused_by_name():
    with pytest.raises(InputRejected, match="not an entity tag") as err:
        encode(WorkItem(**{**ITEM.__dict__, "row_etag": "datetime'x'"}))
    assert err.value.field == "row_etag"


@given(stamp=st.datetimes(), digits=st.integers(0, 9_999_999))
def test_round_trip_of_any_table_etag(stamp, digits):
    etag = f"W/\"datetime'{stamp:%Y-%m-%dT%H}%3A{stamp:%M}%3A{stamp:%S}.{digits:07d}Z'\""
    assert expand_etag(compact_etag(etag)) == etag
    assert decode(encode(WorkItem(**{**ITEM.__dict__, "row_etag": etag}))).row_etag == etag


def test_ingest_leaves_the_row_etag_out_of_an_item_it_would_not_fit():
    """A work item near the message limit goes without its row's ETag (the agent then reads the row): the
    size check before any effect ran without it, so nothing accepted can fail to go out for it."""
    spec = SimpleNamespace(definition=SimpleNamespace(name="logistic", version="1"), sha256="")
    resources = SimpleNamespace(ranks=1, gpus=0, nodes=1, oversubscribe=False)
    job = {"job_id": "j-1", "pool": "cpu", "project": ""}
    plain = len(_Items(job, spec, resources, MAX_MESSAGE_BYTES).text(("s00001", {"r": 1}, None, "")))
    shard = ("s00001", {"r": "x" * (MAX_MESSAGE_BYTES - plain - 20)}, None, "")
    make = _Items(job, spec, resources, MAX_MESSAGE_BYTES)
    assert "row_etag" not in json.loads(make.text(shard, compact_etag(ROW_ETAG), "2026-12-03T22:18:17.170Z"))
    small = json.loads(make.text(("s00002", {"r": 1}, None, ""), compact_etag(ROW_ETAG), "2026-12-03T22:18:17Z"))
    assert small["row_etag"] == compact_etag(ROW_ETAG) and small["queued_at"] == "2026-12-03T22:18:17Z"
