"""The train-torch payload: accuracy, exact resume after a stop, and DistributedDataParallel under torchrun.

Each run goes through ``workers.launch.run_payload`` with real PyTorch on CPU.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from upwell.messages import WorkItem
from workers.launch import run_payload
from workers.payloads.common import read_progress

METRIC_KEYS = ("loss", "accuracy", "test_accuracy_history", "test_loss_history", "test_accuracy", "test_loss")


def item(params: dict, ranks: int = 1, attempt: int = 1) -> WorkItem:
    return WorkItem(job_id="job", shard_id="train", payload="train-torch", pool="gpu", params=params, ranks=ranks,
                    attempt=attempt)


def stop_after_first_checkpoint(workdir: Path):
    stop = threading.Event()

    def tick() -> None:
        if (workdir / "ckpt" / "progress.json").exists():
            stop.set()

    return stop, tick


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The default configuration, run once to the end."""
    result = run_payload(item({}), tmp_path_factory.mktemp("train") / "full")
    assert result.status == "succeeded", result.stderr_tail
    return result


def test_default_configuration_reaches_the_documented_accuracy(uninterrupted):
    m = uninterrupted.metrics
    assert m["test_accuracy"] >= 0.95
    assert len(m["loss"]) == len(m["accuracy"]) == m["epochs"] == 10
    assert m["loss"][-1] < m["loss"][0]
    assert m["device"] == "cpu" and m["samples_per_second"] > 0
    # The last epoch always checkpoints; before it, one more at most every checkpoint_interval_s (30 s by
    # default) of the run's own loop time: exactly one when the run is shorter, whatever the machine's speed.
    assert 1 <= m["checkpoints_written"] <= 1 + int((m["loop_s"] + 1) // 30), (m["checkpoints_written"], m["loop_s"])
    assert [p.name for p in uninterrupted.artifacts] == ["model.pt"]


def test_resume_after_stop_gives_the_same_metrics(tmp_path, uninterrupted):
    stop, tick = stop_after_first_checkpoint(tmp_path / "cut")
    cut = run_payload(item({"checkpoint_interval_s": 0}), tmp_path / "cut", stop=stop, on_tick=tick, tick_s=0.05)
    assert cut.status == "preempted" and cut.exit_code == 75, cut.stderr_tail
    assert cut.metrics["completed"] is False and cut.checkpoints >= 1
    saved = tmp_path / "saved"
    shutil.copytree(cut.checkpoint_dir, saved)

    resumed = run_payload(item({}, attempt=2), tmp_path / "resumed", resume_dir=saved)
    assert resumed.status == "succeeded", resumed.stderr_tail
    # It resumed from the cut's last checkpoint: the epoch and batch where the cut stopped.
    assert cut.metrics["resumed_from"] is None
    assert resumed.resumed_from == read_progress(saved)["marker"], (resumed.resumed_from, read_progress(saved))
    assert resumed.resumed_from["epoch"] == cut.metrics["epoch"] < 10
    assert resumed.metrics["resumed_from"] == resumed.resumed_from
    for key in METRIC_KEYS:
        assert resumed.metrics[key] == uninterrupted.metrics[key], key


@pytest.mark.mpi
def test_ddp_on_two_processes_stops_through_torchrun_and_resumes_on_one(tmp_path):
    params = {"epochs": 6, "arch": "mlp", "checkpoint_interval_s": 0}
    stop, tick = stop_after_first_checkpoint(tmp_path / "cut")
    cut = run_payload(item(params, ranks=2), tmp_path / "cut", stop=stop, on_tick=tick, tick_s=0.05)
    # torchrun itself exits 1 after forwarding SIGTERM; rank 0's exit.json makes it a preemption
    assert cut.status == "preempted", cut.stderr_tail
    assert cut.metrics["world_size"] == 2 and cut.metrics["backend"] == "gloo"

    # a node with fewer slots: rank 0 carries the interrupted epoch's running sums on
    resumed = run_payload(item(params, ranks=1, attempt=2), tmp_path / "resumed", resume_dir=cut.checkpoint_dir)
    assert resumed.status == "succeeded", resumed.stderr_tail
    assert resumed.resumed_from is not None and resumed.metrics["world_size"] == 1
    assert len(resumed.metrics["loss"]) == 6 and resumed.metrics["test_accuracy"] >= 0.95


# A day (the parameter's maximum) is longer than any run here can take: only the last epoch checkpoints.
@pytest.mark.parametrize(("interval", "written"), [(0, 3), (86400, 1), (0.000001, 3)])
def test_checkpoint_cadence_is_every_n_epochs_and_no_sooner_than_the_interval(tmp_path, interval, written):
    params = {"epochs": 3, "arch": "mlp", "checkpoint_interval_s": interval}
    result = run_payload(item(params), tmp_path)
    assert result.status == "succeeded", result.stderr_tail
    assert result.metrics["checkpoints_written"] == written
