"""The heat-mpi payload: analytic accuracy, second-order convergence, and exact checkpoint/restart.

The MPI tests run the real payload through ``workers.launch.run_payload`` under
the real ``mpiexec``; the stop request arrives the way the agent sends it.
"""

from __future__ import annotations

import math
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.heat_reference import solve_serial
from upwell.messages import WorkItem
from upwell.payloads.models import HeatParams
from workers.launch import node_cores, run_payload
from workers.payloads.heat import Grid, split

# A run long enough (about 22k cheap steps) to be stopped part-way after its first checkpoint.
LONG = {"nx": 32, "cfl": 0.01, "t_end": 0.2, "checkpoint_every": 2000}


def l2_error(nx: int) -> float:
    g = Grid.from_params(HeatParams(nx=nx))
    diff = solve_serial(g) - g.exact(g.steps)
    return math.sqrt(float(np.sum(diff * diff)) * g.hx * g.hy)


def item(params: dict, ranks: int, attempt: int = 1) -> WorkItem:
    # More ranks than this machine's cores is declared (upwell.shape refuses it otherwise).
    return WorkItem(job_id="job", shard_id="heat", payload="heat-mpi", pool="mpi", params=params, ranks=ranks,
                    attempt=attempt, oversubscribe=ranks > node_cores())


def field(result) -> np.ndarray:
    with np.load(result.checkpoint_dir.parent / "out" / "field.npz") as f:
        return np.array(f["u"])


def stop_after_first_checkpoint(workdir: Path):
    """A stop event and an on_tick that sets it (and notes when) once the first checkpoint exists."""
    stop = threading.Event()
    stop.at = None

    def tick() -> None:
        if not stop.is_set() and (workdir / "ckpt" / "progress.json").exists():
            stop.at = time.monotonic()
            stop.set()

    return stop, tick


def test_split_covers_the_grid_without_overlap():
    for n, parts in [(8, 3), (64, 2), (65, 4), (9, 9)]:
        blocks = [split(n, parts, k) for k in range(parts)]
        assert blocks[0][0] == 0 and blocks[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:], strict=False))
        assert max(b - a for a, b in blocks) - min(b - a for a, b in blocks) <= 1


def test_analytic_error_is_small_at_the_documented_grid():
    assert l2_error(128) < 1e-5  # the README's tolerance for nx=128


def test_second_order_convergence():
    errors = [l2_error(n) for n in (15, 31, 63)]  # h = 1/16, 1/32, 1/64
    ratios = [a / b for a, b in zip(errors, errors[1:], strict=False)]
    assert all(3.6 < r < 4.4 for r in ratios), ratios


def test_dt_lands_on_t_end_within_the_stability_limit():
    g = Grid.from_params(HeatParams(nx=50, ny=30, t_end=0.013, cfl=0.25))
    assert g.steps * g.dt == pytest.approx(0.013, rel=1e-12)
    assert g.rx + g.ry <= 0.5 + 1e-12


@pytest.mark.mpi
def test_a_2x2_decomposition_matches_the_serial_field_bit_for_bit_and_reports_metrics(tmp_path):
    # 4 ranks: Compute_dims gives 2 x 2, so both the row and the column halo exchange run
    result = run_payload(item({"nx": 40, "ny": 24}, ranks=4), tmp_path / "w")
    assert result.status == "succeeded", result.stderr_tail
    g = Grid.from_params(HeatParams(nx=40, ny=24))
    assert np.array_equal(field(result), solve_serial(g))
    m = result.metrics
    assert m["ranks"] == 4 and m["dims"] == [2, 2] and m["steps"] == g.steps
    assert m["l2_error"] < 1e-4 and m["cells_per_second"] > 0 and m["completed"] is True
    assert {p.name for p in result.artifacts} == {"field.npz", "series.json"}


@pytest.mark.mpi
def test_stop_checkpoints_and_restart_is_bit_identical_on_same_and_other_rank_counts(tmp_path):
    grid = Grid.from_params(HeatParams(**LONG))
    reference = solve_serial(grid)  # bit-identical to any rank count (the test above)

    stop, tick = stop_after_first_checkpoint(tmp_path / "cut")
    cut = run_payload(item(LONG, ranks=2), tmp_path / "cut", stop=stop, on_tick=tick, tick_s=0.1)
    assert cut.status == "preempted" and cut.exit_code == 75, cut.stderr_tail
    assert time.monotonic() - stop.at < 10
    assert cut.checkpoints >= 2 and 0 < cut.metrics["step"] < grid.steps
    assert cut.metrics["completed"] is False and "l2_error" not in cut.metrics
    saved = tmp_path / "saved-ckpt"
    shutil.copytree(cut.checkpoint_dir, saved)

    for ranks in (2, 1):
        resumed = run_payload(item(LONG, ranks=ranks, attempt=2), tmp_path / f"resume{ranks}", resume_dir=saved)
        assert resumed.status == "succeeded", resumed.stderr_tail
        assert resumed.resumed_from == cut.metrics["step"] == resumed.metrics["resumed_from_step"]
        assert resumed.metrics["steps_this_attempt"] == grid.steps - cut.metrics["step"]
        assert resumed.metrics["checkpoints_total"] > cut.metrics["checkpoints_total"]
        assert np.array_equal(field(resumed), reference)


@pytest.mark.mpi
def test_checkpoint_for_another_grid_is_ignored(tmp_path):
    ckpt = tmp_path / "saved"
    ckpt.mkdir()
    other = Grid.from_params(HeatParams(nx=16))
    np.savez(ckpt / "state.npz", field=np.ones((16, 16)), step=3, key=other.key(), series_step=np.array([0]),
             series_norm=np.array([0.5]))
    result = run_payload(item({"nx": 20}, ranks=1), tmp_path / "w", resume_dir=ckpt)
    assert result.status == "succeeded", result.stderr_tail
    assert result.metrics["resumed_from_step"] is None and "different grid" in result.metrics["note"]
    assert np.array_equal(field(result), solve_serial(Grid.from_params(HeatParams(nx=20))))
