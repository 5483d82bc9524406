"""The logistic and channel-stats payloads, and the helpers every payload shares."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from upwell.messages import WorkItem
from upwell.results.figures.channel_stats import pool
from workers.launch import run_payload
from workers.payloads import common
from workers.payloads.logistic import iterate, period


@pytest.mark.parametrize(("r", "expected_period", "lyapunov"), [
    (2.5, 1, math.log(0.5)),  # fixed point x* = 0.6, |f'(x*)| = |2 - r| = 0.5
    (3.2, 2, None),
    (3.5, 4, None),
    (4.0, 0, math.log(2.0)),  # fully chaotic, exponent log 2
])
def test_logistic_period_and_lyapunov(r, expected_period, lyapunov):
    xs, lam = iterate(r, 0.2, 20000, 1000)
    assert period(xs) == expected_period
    if lyapunov is not None:
        assert lam == pytest.approx(lyapunov, abs=0.02)
    assert (lam < 0) == (expected_period > 0)


def test_logistic_at_r_zero_stays_finite():
    xs, lam = iterate(0.0, 0.5, 100, 0)
    assert math.isfinite(lam) and xs[-1] == 0.0


def write_csv(path, table: np.ndarray, names: list[str]) -> None:
    lines = [",".join(names)] + [",".join("" if np.isnan(v) else repr(float(v)) for v in row) for row in table]
    path.write_text("\n".join(lines) + "\n")


def test_channel_stats_through_the_launcher_and_pooled_over_shards(tmp_path):
    rng = np.random.default_rng(1)
    table = np.column_stack([np.arange(3000) * 0.01, rng.normal(3, 2, 3000), rng.uniform(-1, 1, 3000)])
    table[[5, 700], 2] = np.nan
    shards = []
    for k, rows in enumerate((slice(0, 1000), slice(1000, 3000))):
        path = tmp_path / f"s{k}.csv"
        write_csv(path, table[rows], ["time", "a", "b"])
        item = WorkItem(job_id="job", shard_id=f"s{k}", payload="channel-stats", pool="cpu", params={})
        result = run_payload(item, tmp_path / f"w{k}", input_path=path)
        assert result.status == "succeeded", result.stderr_tail
        shards.append(result.metrics)
    assert shards[0]["channels"] == ["a", "b"] and shards[0]["rows"] == 1000
    pooled = pool([s["stats"]["b"] for s in shards])
    b = table[:, 2][~np.isnan(table[:, 2])]
    assert pooled["count"] == b.size and pooled["missing"] == 2
    assert pooled["mean"] == pytest.approx(b.mean(), rel=1e-12)
    assert pooled["std"] == pytest.approx(b.std(), rel=1e-12)
    assert (pooled["min"], pooled["max"]) == (b.min(), b.max())


def test_channel_stats_rejects_text_in_a_channel(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("time,a\n0,1.5\n1,oops\n")
    item = WorkItem(job_id="job", shard_id="s", payload="channel-stats", pool="cpu", params={})
    result = run_payload(item, tmp_path / "w", input_path=path)
    assert result.status == "failed" and result.exit_code == 65 and result.permanent
    assert "oops" in result.stderr_tail


def test_atomic_checkpoint_bumps_progress_and_metrics_drop_non_finite(tmp_path):
    ctx = common.Context(tmp_path, {"attempt": 3, "params": {}})
    assert common.save_checkpoint(ctx, "s.bin", lambda h: h.write(b"one"), marker=5, unit="step") == 1
    assert common.save_checkpoint(ctx, "s.bin", lambda h: h.write(b"two"), marker=9, unit="step") == 2
    assert (tmp_path / "ckpt" / "s.bin").read_bytes() == b"two"
    progress = common.read_progress(tmp_path / "ckpt")
    assert progress["marker"] == 9 and progress["count"] == 2 and progress["attempt"] == 3
    assert not [p for p in (tmp_path / "ckpt").iterdir() if p.name.endswith(".tmp")]
    common.write_metrics(ctx, {"x": float("inf"), "y": np.float64(2.5), "z": np.arange(2)})
    assert json.loads((tmp_path / "out" / "metrics.json").read_text()) == {"x": None, "y": 2.5, "z": [0, 1]}


def test_a_failed_write_leaves_the_old_file(tmp_path):
    target = tmp_path / "f.bin"
    common.atomic_write_bytes(target, b"old")

    def broken(handle) -> None:
        handle.write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        common.atomic_write(target, broken)
    assert target.read_bytes() == b"old" and len(list(tmp_path.iterdir())) == 1


@pytest.mark.parametrize("sample", ["samples/heat-sweep/job.yaml", "samples/train-sweep/job.yaml"])
def test_sample_manifests_validate_point_by_point(sample):
    from pathlib import Path

    from upwell.ingest import manifests
    from upwell.payloads import builtin

    path = Path(__file__).resolve().parents[2] / sample
    manifest = manifests.load_manifest(path.read_bytes(), sample)
    points = manifests.grid_points(manifest, 100, 64 * 1024)
    assert 4 <= len(points) <= 6
    for point in points:
        builtin.get(manifest.payload).params.model_validate(point)
