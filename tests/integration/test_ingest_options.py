"""Real instrument files through the Ingestor on Azurite: CSV rule options and binary pass-through."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from upwell import names
from upwell.ingest.ingestor import Ingestor
from upwell.ledger import Ledger
from upwell.messages import decode
from upwell.settings import Settings
from upwell.storage import Storage
from workers.payloads.channel_stats import channel_stats

BUOY = (b"# buoy 7, firmware 2.1\n# sampled at 2 Hz\ntime;heave;pitch\n"
        b"0.0;0.10;1.0\n0.5;n/a;2.0\n1.0;;3.0\n1.5;0.40;NaN\n2.0;0.50;5.0\n")
RULES = {
    "opts-buoy.yaml": b"match: 'opts/buoy/*.csv'\npayload: channel-stats\ncolumns: {time: float, heave: float, "
                 b"pitch: float}\ndelimiter: ';'\ncomment: '#'\nmissing: ['', 'NaN', 'n/a']\nshard: {rows: 3}\n",
    "opts-strict.yaml": b"match: 'opts/strict/*.csv'\npayload: channel-stats\ncolumns: {time: float, heave: float}\n"
                   b"delimiter: ';'\ncomment: '#'\n",
    "opts-hdf5.yaml": b"match: 'opts/h5/*.h5'\npayload: channel-stats\nformat: binary\n",
}


@pytest.fixture
def store(azurite):
    s = Storage(azurite.connection_string)
    s.ensure()
    for q in names.ALL_QUEUES:
        s.queue(q).clear_messages()
    for name, text in RULES.items():
        s.write(f"{names.PIPELINES}/{name}", text)
    return s


def _items(store, pool="cpu"):
    q, out = store.queue(names.work_queue(pool)), []
    while batch := list(q.receive_messages(max_messages=32, visibility_timeout=5)):
        for m in batch:
            out.append(decode(m.content))
            q.delete_message(m)
    return out


def test_comments_delimiter_and_missing_values_reach_the_payload_as_nan(store, tmp_path: Path):
    store.blob(names.INCOMING, "opts/buoy/day1.csv").upload_blob(BUOY, overwrite=True)
    out = Ingestor(store, Settings()).ingest("opts/buoy/day1.csv")
    assert out.status == "accepted" and out.shards == 2, out
    items = sorted(_items(store), key=lambda i: i.shard_id)
    texts = [store.read(i.input_blob).decode() for i in items]
    assert texts == ["time,heave,pitch\n0.0,0.10,1.0\n0.5,NaN,2.0\n1.0,NaN,3.0\n",
                     "time,heave,pitch\n1.5,0.40,NaN\n2.0,0.50,5.0\n"]
    # the payload reads the shards as they are: the missing cells are missing, not zeros
    totals = {"heave": [0, 0], "pitch": [0, 0]}
    for k, text in enumerate(texts):
        (tmp_path / f"s{k}.csv").write_text(text)
        _, stats = channel_stats(tmp_path / f"s{k}.csv", "time")
        for ch in totals:
            totals[ch][0] += stats[ch].count
            totals[ch][1] += stats[ch].missing
    assert totals == {"heave": [3, 2], "pitch": [4, 1]}


def test_without_missing_values_an_empty_cell_is_quarantined_naming_row_and_field(store):
    store.blob(names.INCOMING, "opts/strict/day1.csv").upload_blob(BUOY, overwrite=True)
    out = Ingestor(store, Settings()).ingest("opts/strict/day1.csv")
    assert out.status == "rejected"
    job = Ledger(store).job(out.job_id)
    assert job.error_field == "heave" and job.error_row == 5  # two comment lines, the header, then rows
    assert store.exists(f"{names.QUARANTINE}/opts/strict/day1.csv")


def test_binary_files_pass_through_whole_as_one_shard(store):
    rng = np.random.default_rng(7)
    data = b"\x89HDF\r\n\x1a\n" + rng.bytes(300_000)  # the HDF5 signature, then binary content
    store.blob(names.INCOMING, "opts/h5/scan-001.h5").upload_blob(data, overwrite=True)
    out = Ingestor(store, Settings()).ingest("opts/h5/scan-001.h5")
    assert out.status == "accepted" and out.shards == 1, out
    [item] = _items(store)
    assert item.input_blob == f"{names.INCOMING}/opts/h5/scan-001.h5"  # no copy: the upload itself
    assert store.read(item.input_blob) == data
    [shard] = Ledger(store).shards(out.job_id)
    assert shard.input_sha256 == hashlib.sha256(data).hexdigest()
    assert not list(store.list(names.SHARDS, f"{out.job_id}/"))


def test_a_binary_rule_still_refuses_archives_by_content(store):
    store.blob(names.INCOMING, "opts/h5/packed.h5").upload_blob(b"PK\x03\x04" + b"\x00" * 600, overwrite=True)
    out = Ingestor(store, Settings()).ingest("opts/h5/packed.h5")
    assert out.status == "rejected" and "zip archive" in out.message
