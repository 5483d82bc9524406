"""Issue 27, item 1: every blob that upwell writes for a job carries the blob index tag project=<name>,
read back from Azurite; uploads land under incoming/<project>/ and the ledger records the project.

The sample instrument drop (samples/pipelines/buoy.yaml, matched under incoming/ocean/) runs through the
real function_app on the devhost and local workers: its shards, results, artifacts and report
are read back with their tags. A manifest that names another project than its folder, and one that names
no registered payload, are quarantined under quarantine/ocean/ with the same tag. Checkpoints go through
the agent's staging with the work item's project, read back the same way, and so does a payload.log (the
sample's payload prints nothing, so its run keeps none).
"""

from __future__ import annotations

import pytest

from tests.pipeline_helpers import REPO, pipeline_env, running_host, wait_reported
from upwell import names
from upwell.ingest.blobnames import job_id_for
from upwell.messages import WorkItem
from upwell.storage import Storage

pytestmark = pytest.mark.access

RULE = (REPO / "samples" / "pipelines" / "buoy.yaml").read_text().replace(
    'match: "instruments/buoy/*.csv"', 'match: "ocean/buoy/*.csv"')
CSV = "".join((REPO / "samples" / "instrument" / "buoy-2026-11-30.csv").read_text().splitlines(True)[:1501])


def tags_under(store: Storage, container: str, prefix: str) -> dict[str, dict]:
    """Every blob under container/prefix and its index tags."""
    return {f"{container}/{b.name}": store.blob(container, b.name).get_blob_tags()
            for b in store.list(container, prefix)}


def _run(store: Storage, connection: str, state_dir):
    """The instrument drop and the two refused manifests through the running pipeline; (job, refused)."""
    with running_host(connection, state_dir):
        etag = store.put(f"{names.INCOMING}/ocean/buoy/day.csv", CSV.encode())
        claimed = store.put(f"{names.INCOMING}/ocean/claims/job.yaml",
                            b"payload: logistic\nproject: clinic\ngrid: {r: [3.1]}\n")
        unknown = store.put(f"{names.INCOMING}/ocean/unknown/job.yaml", b"payload: no-such-payload\n")
        job = wait_reported(store, job_id_for("ocean/buoy/day.csv", etag), timeout=150)
        refused = [wait_reported(store, job_id_for(f"ocean/{n}/job.yaml", e), timeout=60)
                   for n, e in (("claims", claimed), ("unknown", unknown))]
    return job, refused


def test_every_blob_of_a_sample_job_carries_its_project(azurite, tmp_path, monkeypatch):
    assert 'match: "ocean/buoy/*.csv"' in RULE
    store = Storage(azurite.connection_string)
    store.ensure()
    pipeline_env(monkeypatch, azurite.connection_string, tmp_path, UPWELL_PROJECT_FOLDERS="true")
    store.write(f"{names.PIPELINES}/buoy-ocean.yaml", RULE.encode())
    try:
        job, refused = _run(store, azurite.connection_string, tmp_path)
    finally:
        store.delete(f"{names.PIPELINES}/buoy-ocean.yaml")  # the session's Azurite is shared
    assert job.status == "succeeded" and job.project == "ocean" and job.shards_total == 2, job
    assert [r.status for r in refused] == ["rejected", "rejected"] and "clinic" in refused[0].message

    written = {}
    # The CSV's row blocks reference the upload itself (upwell.shardref): no shard copies; the upload under
    # incoming/ocean/ is the uploader's own write, tagged or not by them.
    assert not tags_under(store, names.SHARDS, f"{job.job_id}/")
    for container in (names.RESULTS, names.REPORTS):
        found = tags_under(store, container, f"{job.job_id}/")
        assert found, f"nothing under {container}/{job.job_id}/"
        written.update(found)
    for folder in ("claims", "unknown"):
        written.update(tags_under(store, names.QUARANTINE, f"ocean/{folder}/"))
    kinds = {path.rsplit(".", 1)[-1] for path in written}
    assert {"json", "npz", "html"} <= kinds, sorted(written)  # results, artifacts, report
    assert "log" not in kinds, sorted(written)  # welch prints nothing: no payload.log (a kept one: below)
    assert sum(p.startswith(f"{names.QUARANTINE}/") for p in written) == 4  # two uploads, two error files
    untagged = {p: t for p, t in written.items() if t != {"project": "ocean"}}
    assert not untagged, untagged


def test_checkpoints_carry_the_work_items_project(azurite, tmp_path):
    """The agent's staging writes a shard's checkpoint files with the item's project (and none without)."""
    from upwell import logs
    from workers.staging import Staging
    from workers.workdir import LaunchResult

    store = Storage(azurite.connection_string)
    store.ensure()
    ckpt = tmp_path / "ckpt"
    (ckpt / "sub").mkdir(parents=True)
    (ckpt / "state.npz").write_bytes(b"1")
    (ckpt / "sub" / "more.bin").write_bytes(b"2")
    staging = Staging(store, str(tmp_path / "scratch"), logs.get("test"))
    for project, want in (("ocean", {"project": "ocean"}), ("", {})):
        item = WorkItem(job_id=f"ck-{project or 'none'}", shard_id="s00000", payload="heat", pool="cpu",
                        checkpoint_prefix=f"{names.CHECKPOINTS}/ck-{project or 'none'}/s00000/", project=project)
        assert staging.checkpoint_out(item, ckpt) == 2
        found = tags_under(store, names.CHECKPOINTS, f"{item.job_id}/")
        assert len(found) == 2 and all(t == want for t in found.values()), found
        # a failed attempt's payload.log, when its payload printed something, goes up with the project too
        item = WorkItem(job_id=f"lg-{project or 'none'}", shard_id="s00000", payload="heat", pool="cpu",
                        result_prefix=f"{names.RESULTS}/lg-{project or 'none'}/s00000", project=project)
        for printed in (0, len(b"boom\n")):
            (tmp_path / "payload.log").write_bytes(b"$ heat\n" + b"boom\n"[:printed])
            staging.keep_log(item, LaunchResult(status="failed", exit_code=1, metrics={}, artifacts=[],
                                                checkpoint_dir=ckpt, checkpoints=0, resumed_from=None,
                                                stderr_tail="", run_s=0.1, log_path=tmp_path / "payload.log",
                                                log_bytes=printed), earlier=False)
            found = tags_under(store, names.RESULTS, f"{item.job_id}/")
            assert list(found.values()) == ([want] if printed else []), found  # a silent attempt keeps none
