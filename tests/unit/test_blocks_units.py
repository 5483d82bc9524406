"""Blocks of points per work item (issue 24): the grid fanned out in blocks (upwell.ingest.fanout, .blocks), their
limits, and the block runner (workers.blocks) with a stand-in launcher: resume skips finished points, a failing
point is recorded and retried alone."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from upwell.errors import BlockTooLarge, InputRejected
from upwell.ingest import blocks, manifests
from upwell.ingest.accept import _Items
from upwell.ingest.fanout import GridShards
from upwell.messages import WorkItem, decode, encode
from upwell.payloads.registry import Registry
from workers.blocks import run_block
from workers.results import block_points
from workers.workdir import LaunchResult


def manifest(n: int, k: int | str = 1, extra: str = "") -> manifests.Manifest:
    values = ", ".join(str(round(3 + i / n, 6)) for i in range(n))
    text = f"payload: logistic\npoints_per_item: {k}\nparams: {{steps: 50}}\ngrid: {{r: [{values}]}}\n{extra}"
    return manifests.load_manifest(text.encode(), "job.yaml", ["logistic"])


def definition():
    return Registry().resolve("logistic").definition


def test_a_grid_in_blocks_of_k_makes_one_shard_per_block_each_carrying_its_points_in_order():
    shards = GridShards(manifest(10, 4), 100, 1024, definition(), k=4)
    assert (len(shards), shards.points, shards.k) == (3, 10, 4)
    made = list(shards)
    assert [s[0] for s in made] == ["s00000", "s00001", "s00002"]
    assert [len(s[5]) for s in made] == [4, 4, 2]  # the last block holds the rest
    assert made[0][1] == {"steps": 50} and made[0][5][1] == {"r": 3.1}  # shared params, then each point's own
    assert [p["r"] for s in made for p in s[5]] == [round(3 + i / 10, 6) for i in range(10)]
    assert len({s[3] for s in made}) == 3  # each block its own digest


def test_one_point_per_item_is_todays_fan_out_exactly():
    one = list(GridShards(manifest(3), 100, 1024, definition()))
    assert [len(s) for s in one] == [4, 4, 4] and one[0][1] == {"steps": 50, "r": 3.0}
    item = WorkItem(job_id="j", shard_id="s00000", payload="logistic", pool="cpu")
    assert "points" not in json.loads(encode(item))  # a one-point message is encoded as before
    block = WorkItem(job_id="j", shard_id="s00000", payload="logistic", pool="cpu", points=[{"r": 1.0}])
    assert decode(encode(block)).points == [{"r": 1.0}]


@pytest.mark.parametrize(("value", "message"), [(0, "from 1 to"), (1.5, "whole number"), (True, "whole number"),
                                                ("many", "'auto'")])
def test_points_per_item_is_validated_with_a_clear_error(value, message):
    with pytest.raises(InputRejected) as err:
        manifest(3, json.dumps(value) if not isinstance(value, str) else value)
    assert err.value.field == "points_per_item" and message in err.value.message


def test_points_per_item_is_for_a_grid_not_for_data_blobs():
    with pytest.raises(InputRejected, match="points_per_item applies to a grid"):
        manifests.load_manifest(b"payload: logistic\npoints_per_item: 4\ndata: [a.csv]\n", "job.yaml", ["logistic"])


def test_the_shard_limit_counts_work_items_not_points():
    assert len(GridShards(manifest(40, 8), 5, 1024, definition(), k=8)) == 5
    with pytest.raises(InputRejected, match="in 6 blocks of 7"):
        GridShards(manifest(40, 7), 5, 1024, definition(), k=7)


def test_auto_fills_an_item_to_the_target_time_within_the_cap_and_the_grid():
    m = manifest(500, "auto", "estimate: {node_seconds_per_shard: 0.5}\n")
    assert blocks.size_for(m, 30, 64) == (60, True)
    assert blocks.size_for(m, 300, 64) == (64, True)  # capped
    assert blocks.size_for(manifest(10, "auto", "estimate: {node_seconds_per_shard: 0.01}\n"), 30, 64)[0] == 10
    assert blocks.size_for(manifest(10, "auto", "estimate: {node_seconds_per_shard: 60}\n"), 30, 64)[0] == 1
    assert blocks.size_for(manifest(10, 7), 30, 64) == (7, False)


def long_manifest(n: int, k: int) -> manifests.Manifest:
    """Points of about 120 characters each (a long string parameter per point)."""
    grid = {"r": [3.5], "tag": [f"run-{i:04d}-" + "x" * 100 for i in range(n)]}
    doc = {"payload": "logistic", "points_per_item": k, "grid": grid}
    return manifests.Manifest.model_validate(doc)


def test_a_block_too_large_for_a_shard_row_is_refused_naming_the_k_that_fits():
    shards = GridShards(long_manifest(300, 200), 100, 1024, None, k=200)
    shards.definition = _AnyParams()
    with pytest.raises(BlockTooLarge) as err:
        list(shards)
    assert err.value.field == "points_per_item" and "use points_per_item: 1" in err.value.message
    fits = int(err.value.message.rsplit("points_per_item: ", 1)[1].split()[0])
    assert 100 <= fits < 200 and len(blocks.points_json(list(shards._deltas())[:fits])) <= blocks.POINTS_CHARS


def test_auto_shrinks_k_to_what_the_first_block_says_fits():
    m = long_manifest(300, 200).model_copy(update={"points_per_item": "auto"})
    shards = GridShards(m, 100, 1024, _AnyParams(), k=200, fit=True)
    assert 100 <= shards.k < 200
    assert all(len(blocks.points_json(s[5])) <= blocks.POINTS_CHARS for s in shards)


def test_a_block_whose_work_item_would_pass_the_message_limit_is_refused_at_submit():
    shard = ("s00000", {"steps": 50}, None, "d", None, [{"r": 3.0 + i / 1000} for i in range(100)])
    job = {"job_id": "j", "pool": "cpu", "project": "p"}
    spec = type("Spec", (), {"definition": definition(), "sha256": "0" * 64})()
    items = _Items(job, spec, manifests.Resources(), 1500)
    with pytest.raises(BlockTooLarge) as err:
        items.text(shard)
    fits = int(err.value.message.rsplit("points_per_item: ", 1)[1].split()[0])
    assert 1 <= fits < 100 and err.value.limit == "max_message_bytes=1500"
    assert len(list(_Items(job, spec, manifests.Resources(), 64 * 1024).checked([shard]))) == 100  # priced per point


class _AnyParams:
    """A definition that takes any parameters (the size tests' long string values)."""

    params: dict = {}
    name = "any"


@pytest.fixture(autouse=True)
def _any_params(monkeypatch):
    from upwell.payloads import params as payload_params

    real = payload_params.validate
    monkeypatch.setattr(payload_params, "validate",
                        lambda d, p: None if isinstance(d, _AnyParams) else real(d, p))


# -- the block runner -------------------------------------------------------------------------------------------

class Launcher:
    """Stands in for workers.launch.run_payload: records the points it ran; a point whose r is in ``fail`` exits 1
    (65 where ``permanent``); ``stop_at`` sets the stop event as that point starts and the point checkpoints."""

    def __init__(self, fail=(), permanent=False, stop_at=None, stop=None):
        self.ran: list[float] = []
        self.fail, self.permanent, self.stop_at, self.stop = set(fail), permanent, stop_at, stop
        self.resumed: list[bool] = []  # whether each point was given its own checkpoint to resume from

    def __call__(self, item: WorkItem, workdir: Path, *, resume_dir=None, stop=None, **_) -> LaunchResult:
        r = item.params["r"]
        workdir.mkdir(parents=True)
        (workdir / "out").mkdir()
        (workdir / "ckpt").mkdir()
        (workdir / "payload.log").write_text(f"point r={r}\n")
        self.resumed.append(bool(resume_dir) and (resume_dir / "state.bin").is_file())
        if r == self.stop_at and self.stop is not None and not self.stop.is_set():
            self.stop.set()
            (workdir / "ckpt" / "state.bin").write_text("half")
            return self._result(workdir, "preempted", 75)
        self.ran.append(r)
        if r in self.fail:
            return self._result(workdir, "failed", 65 if self.permanent else 1)
        (workdir / "out" / "x.txt").write_text(str(r))
        return self._result(workdir, "succeeded", 0, metrics={"r": r, "lyapunov": -r})

    @staticmethod
    def _result(workdir: Path, status: str, code: int, metrics=None) -> LaunchResult:
        arts = sorted((workdir / "out").iterdir())
        return LaunchResult(status=status, exit_code=code, metrics=metrics or {}, artifacts=arts,
                            checkpoint_dir=workdir / "ckpt", checkpoints=0, resumed_from=None, stderr_tail="",
                            run_s=0.01, log_path=workdir / "payload.log", permanent=code == 65)


class Saved:
    """Stands in for storage: the shard's checkpoint files and the uploaded outputs."""

    def __init__(self, root: Path):
        self.root, self.saves, self.outputs = root, 0, {}
        root.mkdir(parents=True, exist_ok=True)

    def save(self, path: Path) -> None:
        (self.root / path.name).write_bytes(path.read_bytes())
        self.saves += 1

    def stage_out(self, item: WorkItem, artifacts, out_dir: Path) -> dict[str, str]:
        out = {p.name: f"{item.result_prefix}/{p.name}" for p in artifacts}
        self.outputs.update({v: item.params["r"] for v in out.values()})
        return out


def block(n: int = 5) -> WorkItem:
    return WorkItem(job_id="j", shard_id="s00001", payload="logistic", pool="cpu", params={"steps": 50},
                    result_prefix="results/j/s00001", checkpoint_prefix="checkpoints/j/s00001/",
                    points=[{"r": float(i)} for i in range(n)])


def test_a_preempted_block_resumes_at_the_next_undone_point_and_never_reruns_a_finished_one(tmp_path):
    stop, store = threading.Event(), Saved(tmp_path / "stored")
    first = Launcher(stop_at=2.0, stop=stop)
    one = run_block(block(), tmp_path / "a1", save=store.save, stage_out=store.stage_out, stop=stop, run_one=first)
    assert one.status == "preempted" and first.ran == [0.0, 1.0] and store.saves == 2
    # the preempted attempt's checkpoint is what the agent uploads (workers.settle): the state and the point's own
    stored = one.checkpoint_dir
    assert json.loads((stored / "block.json").read_text())["current"] == 2
    assert (stored / "point" / "state.bin").read_text() == "half"
    second = Launcher()
    two = run_block(block(), tmp_path / "a2", save=store.save, stage_out=store.stage_out, resume_dir=stored,
                    stop=threading.Event(), run_one=second)
    assert second.ran == [2.0, 3.0, 4.0]  # 0 and 1 never again
    assert second.resumed == [True, False, False]  # point 2 resumes from its own checkpoint
    assert two.status == "succeeded" and two.resumed_from == "2 of 5 points done"
    assert [e["point"] for e in two.points] == [0, 1, 2, 3, 4] and all(e["status"] == "succeeded" for e in two.points)
    assert two.points[3]["params"] == {"steps": 50, "r": 3.0} and two.points[3]["metrics"]["r"] == 3.0
    assert two.points[3]["artifacts"] == {"x.txt": "results/j/s00001/p3/x.txt"}
    assert two.metrics == {"points": 5, "points_succeeded": 5, "points_failed": 0}
    assert "point r=4.0" in two.log_path.read_text()


def test_a_failing_point_is_recorded_and_the_block_goes_on_then_a_retry_runs_only_that_point(tmp_path):
    store = Saved(tmp_path / "stored")
    first = Launcher(fail={1.0})
    one = run_block(block(3), tmp_path / "a1", save=store.save, stage_out=store.stage_out, run_one=first)
    assert first.ran == [0.0, 1.0, 2.0]  # the block went on past the failure
    assert one.status == "failed" and not one.permanent and one.exit_code == 1
    assert [e["status"] for e in one.points] == ["succeeded", "failed", "succeeded"]
    assert one.points[1]["error"] == "exit code 1" and "point r=1.0" in one.points[1]["log_tail"]
    assert "point p1: exit code 1" in one.stderr_tail and one.metrics["points_failed"] == 1
    retry = Launcher()
    two = run_block(block(3), tmp_path / "a2", save=store.save, stage_out=store.stage_out,
                    resume_dir=one.checkpoint_dir, run_one=retry)
    assert retry.ran == [1.0] and two.status == "succeeded"


def test_a_point_with_unusable_input_fails_the_block_at_once_and_is_not_run_again(tmp_path):
    store = Saved(tmp_path / "stored")
    one = run_block(block(3), tmp_path / "a1", save=store.save, stage_out=store.stage_out,
                    run_one=Launcher(fail={0.0}, permanent=True))
    assert one.status == "failed" and one.permanent and one.exit_code == 65
    again = Launcher()
    run_block(block(3), tmp_path / "a2", save=store.save, stage_out=store.stage_out, resume_dir=one.checkpoint_dir,
              run_one=again)
    assert again.ran == []


def test_a_block_poisoned_before_it_ran_still_lists_every_point():
    listed = block_points(block(3), None, "failed", "unusable input")
    assert [(e["point"], e["status"], e["params"]["r"]) for e in listed] == [(0, "failed", 0.0), (1, "failed", 1.0),
                                                                           (2, "failed", 2.0)]


# -- reading a block's result as its points -------------------------------------------------------------------------

def test_a_block_result_and_row_expand_into_points_with_their_own_status_params_and_share_of_node_time():
    from upwell.results.points import expand, progress
    from upwell.rows import JobRow, ShardRow, ShardState

    doc = {"shard_id": "s00002", "status": "succeeded", "params": {"steps": 50}, "node": {"id": "n1"},
           "timings": {"node_seconds": 4.0, "started": "a", "finished": "b"},
           "points": [{"point": 0, "params": {"steps": 50, "r": 1.0}, "status": "succeeded", "run_s": 3.0,
                       "metrics": {"m": 1}},
                      {"point": 1, "params": {"steps": 50, "r": 2.0}, "status": "failed", "run_s": 1.0,
                       "error": "exit code 1", "log_tail": "boom"}]}
    row = ShardRow(job_id="j", shard_id="s00002", status=ShardState.SUCCEEDED, params='{"steps": 50}',
                   points='[{"r": 1.0}, {"r": 2.0}]', node_seconds=4.0)
    plain = ShardRow(job_id="j", shard_id="s00003", status=ShardState.QUEUED, params='{"r": 9}')
    rows, docs = expand([row, plain], [doc])
    assert [(r.shard_id, r.status.value, r.parameters()["r"]) for r in rows] == [
        ("s00002.p0", "succeeded", 1.0), ("s00002.p1", "failed", 2.0), ("s00003", "queued", 9)]
    assert [(d["shard_id"], d["status"], d["timings"]["node_seconds"]) for d in docs] == [
        ("s00002.p0", "succeeded", 3.0), ("s00002.p1", "failed", 1.0)]
    assert docs[1]["error"] == "exit code 1" and docs[1]["stderr_tail"] == "boom" and docs[0]["metrics"] == {"m": 1}
    job = JobRow(job_id="j", shards_total=3, shards_done=1, points_total=40, points_per_item=16)
    assert progress(job) == {"total": 40, "done": 16, "per_item": 16}
    ended = JobRow(job_id="j", shards_total=3, shards_done=3, points_total=40, points_per_item=16)
    assert progress(ended)["done"] == 40  # the last block's 8, exact once the job ends
    assert progress(JobRow(job_id="j", shards_total=3)) is None


def test_a_reduce_stages_a_block_result_as_its_points_results(tmp_path):
    from workers.staging import as_points

    block_doc = {"shard_id": "s00000", "status": "succeeded", "timings": {},
                 "points": [{"point": j, "params": {"nx": 10 * (j + 1)}, "status": "succeeded",
                             "metrics": {"l2_error": 0.1 / (j + 1)}} for j in range(2)]}
    (tmp_path / "s00000.json").write_text(json.dumps(block_doc))
    (tmp_path / "s00001.json").write_text(json.dumps({"shard_id": "s00001", "status": "succeeded"}))
    for name in ("s00000.json", "s00001.json"):
        as_points(tmp_path / name, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s00000.p0.json", "s00000.p1.json", "s00001.json"]
    assert json.loads((tmp_path / "s00000.p1.json").read_text())["params"] == {"nx": 20}


def test_short_points_still_renew_the_lease_and_see_a_cancel_once_a_tick(tmp_path, monkeypatch):
    import workers.blocks as runner

    clock = iter(float(i) for i in range(1000))  # one second a call: every point takes about a second
    monkeypatch.setattr(runner.time, "monotonic", lambda: next(clock))
    ticks, stop, store = [], threading.Event(), Saved(tmp_path / "stored")

    def tick():
        ticks.append(1)
        if len(ticks) == 2:
            stop.set()  # the second tick reads the job cancelled

    one = run_block(block(8), tmp_path / "a", save=store.save, stage_out=store.stage_out, stop=stop, on_tick=tick,
                    run_one=Launcher(), tick_s=2.0)
    assert len(ticks) == 2 and one.status == "preempted"  # stopped at the next point, its checkpoint kept
    assert 0 < sum(e["status"] == "succeeded" for e in one.points) < 8
