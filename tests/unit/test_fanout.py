"""Fan-out of a big job (upwell.ingest.fanout): a grid made lazily, and sends that report in order."""

from __future__ import annotations

import threading

import pytest

from upwell.errors import InputRejected
from upwell.ingest import manifests
from upwell.ingest.fanout import GridShards, Pacer, send_in_order
from upwell.payloads.registry import Registry


def grid(n: int, extra: str = "", x0: int = 1) -> manifests.Manifest:
    values = ", ".join(str(3 + i / n) for i in range(n)) + extra
    starts = ", ".join(str(0.1 + i / (2 * x0)) for i in range(x0))
    text = f"payload: logistic\nparams: {{steps: 50, burn_in: 10}}\ngrid: {{r: [{values}], x0: [{starts}]}}\n"
    return manifests.load_manifest(text.encode(), "job.yaml", ["logistic"])


def definition():
    return Registry().resolve("logistic").definition


def test_a_grid_of_100000_points_has_its_length_without_a_pass_and_yields_them_in_order():
    shards = GridShards(grid(1000, x0=100), 100_000, 1024, definition())
    assert len(shards) == 100_000
    it = iter(shards)
    first = next(it)
    assert first[0] == "s00000" and first[1] == {"steps": 50, "burn_in": 10, "r": 3.0, "x0": 0.1}
    assert first[2] is None and len(first[3]) == 64
    assert next(it)[0] == "s00001"
    assert [s[0] for s in GridShards(grid(3), 10, 1024, definition())] == ["s00000", "s00001", "s00002"]


def test_a_bad_point_is_named_by_its_row_as_the_list_reader_names_it():
    shards = GridShards(grid(4, ", three"), 10, 1024, definition())
    with pytest.raises(InputRejected) as lazy:
        list(shards)
    with pytest.raises(InputRejected) as listed:
        manifests.grid_points(grid(4, ", three"), 10, 1024, definition())
    assert (lazy.value.row, lazy.value.field, lazy.value.message) == \
        (listed.value.row, listed.value.field, listed.value.message) == (4, "grid.r", listed.value.message)


def test_a_grid_past_the_limit_is_refused_before_any_point_is_made():
    with pytest.raises(InputRejected, match="grid has 11 points; the limit is 10") as exc:
        GridShards(grid(11), 10, 1024, definition())
    assert exc.value.field == "grid"


def test_sends_run_concurrently_and_progress_comes_in_order():
    sent, marks, lock = [], [], threading.Lock()

    def send(i, text):
        with lock:
            sent.append((i, text))

    n = send_in_order(((i, f"m{i}") for i in range(0, 500, 2)), send, marks.append, workers=8, per_s=0)
    assert n == 250 and sorted(sent) == [(i, f"m{i}") for i in range(0, 500, 2)]
    assert marks == [i + 1 for i in range(0, 500, 2)]  # every index before a mark had gone out


def test_a_failed_send_sends_no_more_and_raises():
    seen = []

    def send(i, _):
        if i == 30:
            raise OSError("the queue said 500")
        seen.append(i)

    marks = []
    with pytest.raises(OSError, match="500"):
        send_in_order(((i, None) for i in range(10_000)), send, marks.append, workers=4, per_s=0)
    assert len(seen) < 100 and max(marks) <= 30  # the window is bounded; no mark passes the failure


def test_the_pacer_spaces_starts_at_the_rate():
    now, slept = [0.0], []

    def sleep(s):
        slept.append(s)
        now[0] += s

    pacer = Pacer(2000, clock=lambda: now[0], sleep=sleep)
    for _ in range(2001):
        pacer.wait()
    assert now[0] == pytest.approx(1.0)  # 2,001 starts at 2,000 a second take one second
    assert Pacer(0).gap == 0.0
