"""Welch per shard, combined by segment-weighted mean, against scipy.signal.welch on the whole file."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.signal import welch

from upwell.messages import WorkItem
from upwell.results.figures.welch import aggregate
from workers.launch import run_payload
from workers.payloads.welch import spectrum

FS, N, NPERSEG, STEP = 100.0, 1 << 15, 256, 128  # 50 % overlap: step = nperseg - noverlap


@pytest.fixture(scope="module")
def data() -> np.ndarray:
    rng = np.random.default_rng(0)
    t = np.arange(N) / FS
    return np.vstack([np.sin(2 * np.pi * 5 * t) + rng.normal(size=N),
                      0.5 * np.sin(2 * np.pi * 12.5 * t) + rng.normal(scale=0.5, size=N)])


def combine(data: np.ndarray, bounds: list[tuple[int, int]]):
    parts = [spectrum(data[:, a:b], FS, NPERSEG, NPERSEG - STEP) for a, b in bounds]
    return aggregate([{"freqs": f, "psd": p, "n_segments": n} for f, p, n in parts]), sum(n for *_, n in parts)


def test_overlapping_shards_reproduce_whole_file_welch_to_rounding(data):
    length = 4096  # a multiple of STEP; each shard reaches NPERSEG - STEP rows into the next
    bounds = [(a, min(N, a + length + NPERSEG - STEP)) for a in range(0, N, length)]
    (freqs, psd), segments = combine(data, bounds)
    f_whole, whole = welch(data, fs=FS, nperseg=NPERSEG, noverlap=NPERSEG - STEP)
    assert segments == (N - NPERSEG) // STEP + 1
    np.testing.assert_array_equal(freqs, f_whole)
    np.testing.assert_allclose(psd, whole, rtol=1e-12)


def test_disjoint_shards_stay_within_the_documented_tolerance(data):
    shards = 4
    length = N // shards
    (freqs, psd), segments = combine(data, [(a, a + length) for a in range(0, N, length)])
    _, whole = welch(data, fs=FS, nperseg=NPERSEG, noverlap=NPERSEG - STEP)
    total = (N - NPERSEG) // STEP + 1
    dropped = total - segments
    assert dropped == shards - 1  # one straddling segment per boundary at 50 % overlap
    rel = np.abs(psd / whole - 1)
    assert np.median(rel) <= dropped / total and rel.max() <= 4 * dropped / total
    assert freqs[np.argmax(psd[0])] == pytest.approx(5.0, abs=FS / NPERSEG)


def test_short_shard_has_no_weight_and_mismatched_grids_are_refused(data):
    (_, psd), _ = combine(data, [(0, 8192), (8192, 8192 + 100)])
    (_, alone), _ = combine(data, [(0, 8192)])
    np.testing.assert_array_equal(psd, alone)
    f, p, n = spectrum(data[:, :1024], FS, 128, 64)
    with pytest.raises(ValueError):
        aggregate([{"freqs": f, "psd": p, "n_segments": n}, {"freqs": f[:-1], "psd": p[:, :-1], "n_segments": n}])
    with pytest.raises(ValueError):
        aggregate([])


def test_payload_writes_psd_npz_matching_scipy(tmp_path, data):
    rows = 4000
    csv = tmp_path / "shard.csv"
    table = np.column_stack([np.arange(rows) / FS, data[:, :rows].T])
    np.savetxt(csv, table, delimiter=",", header="time,a,b", comments="", fmt="%.17g")
    item = WorkItem(job_id="job", shard_id="s0", payload="welch", pool="cpu", params={"nperseg": NPERSEG})
    result = run_payload(item, tmp_path / "w", input_path=csv)
    assert result.status == "succeeded", result.stderr_tail
    with np.load(result.checkpoint_dir.parent / "out" / "psd.npz") as npz:
        f, psd = welch(data[:, :rows], fs=FS, nperseg=NPERSEG)
        np.testing.assert_allclose(npz["psd"], psd, rtol=1e-12)
        assert list(npz["channels"]) == ["a", "b"] and list(npz["n_segments"]) == [30, 30]
    assert result.metrics["peak_frequency"]["a"] == pytest.approx(5.0, abs=FS / NPERSEG)


def test_payload_rejects_a_gap_naming_channel_and_row(tmp_path):
    csv = tmp_path / "gap.csv"
    csv.write_text("time,a\n0,1\n0.01,\n0.02,3\n")
    item = WorkItem(job_id="job", shard_id="s0", payload="welch", pool="cpu", params={})
    result = run_payload(item, tmp_path / "w", input_path=csv)
    assert result.status == "failed" and result.exit_code == 65 and result.permanent
    assert "'a'" in result.stderr_tail and "row 2" in result.stderr_tail
