"""A big blob is read in few, large ranges (``upwell.storage.CHUNK_GET_BYTES``), against Azurite.

The SDK's first Get Blob asks for up to 32 MiB (``max_single_get_size``); every range after it is one request of
``CHUNK_GET_BYTES``, where the SDK's default is 4 MiB. The tests note the ``x-ms-range`` of every Get Blob
the transport sends.
"""

from __future__ import annotations

import pytest
import requests

from upwell.storage import CHUNK_GET_BYTES, Storage

MIB = 1 << 20


@pytest.fixture
def ranges(monkeypatch) -> list[str]:
    seen: list[str] = []
    send = requests.adapters.HTTPAdapter.send

    def noting(adapter, request, *args, **kwargs):
        if request.method == "GET" and "x-ms-range" in request.headers:
            seen.append(request.headers["x-ms-range"])
        return send(adapter, request, *args, **kwargs)

    monkeypatch.setattr(requests.adapters.HTTPAdapter, "send", noting)
    return seen


def test_a_big_blob_is_read_in_16_mib_ranges_after_the_first(store: Storage, ranges: list[str]) -> None:
    body = bytes(range(256)) * (48 * MIB // 256) + b"tail!"
    store.blob("incoming", "ranges/big.bin").upload_blob(body, overwrite=True, max_concurrency=4)
    ranges.clear()
    assert b"".join(store.chunks("incoming/ranges/big.bin")) == body
    assert CHUNK_GET_BYTES == 16 * MIB
    assert ranges == [f"bytes=0-{32 * MIB - 1}", f"bytes={32 * MIB}-{48 * MIB - 1}", f"bytes={48 * MIB}-{48 * MIB + 4}"]


def test_a_blob_with_dot_segments_is_read_in_the_same_ranges(store: Storage, ranges: list[str]) -> None:
    body = b"x" * (40 * MIB)
    store.blob("incoming", "ranges/a/../b.bin").upload_blob(body, overwrite=True)
    ranges.clear()
    assert b"".join(store.chunks("incoming/ranges/a/../b.bin")) == body
    assert ranges == [f"bytes=0-{32 * MIB - 1}", f"bytes={32 * MIB}-{40 * MIB - 1}"]
