"""Azure's own failure modes (issue 23), with real agents on Azurite and Azure played by stand-ins.

Scheduled Events (items 1 and 2): each agent runs as an Azure node does, its eviction watcher on
(``UPWELL_EVICTION_WATCH``) and IMDS at a stand-in (``upwell.local.imds``) that serves the documented
instance metadata and Scheduled Events and records the acknowledgement POST. A shard of ``heat-mpi``
(real mpiexec, two ranks, a checkpoint every ``CKPT_EVERY`` steps) runs on the agent while an event is
scheduled. Nothing may be lost: the shard's result exists once and it succeeded (``lost`` = 0).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from email.utils import parsedate_to_datetime
from pathlib import Path

import pytest

from tests.faults import harness
from tests.pipeline_helpers import wait_for
from upwell import names
from upwell.ingest.ingestor import Ingestor
from upwell.ledger import Ledger
from upwell.local.imds import ImdsStandIn
from upwell.settings import Settings
from upwell.storage import Storage

pytestmark = [pytest.mark.cloudfaults, pytest.mark.mpi]

REPO = Path(__file__).resolve().parents[2]
POOL = "mpi"
CKPT_EVERY = 100  # heat-mpi steps between checkpoints: the most work an eviction may cost
NOTICE_S = 30.0  # a Preempt's documented minimum notice


def manifest(t_end: float) -> bytes:
    return (b"payload: heat-mpi\npool: mpi\nresources: {ranks: 2}\n"
            + f"params: {{nx: 256, t_end: {t_end}, checkpoint_every: {CKPT_EVERY}}}\n".encode()
            + b"grid: {alpha: [1.0]}\n")


def submit(store: Storage, name: str, t_end: float) -> str:
    store.ensure()
    store.queue(names.work_queue(POOL)).clear_messages()
    blob = f"cloudfaults/{name}/job.yaml"
    store.blob(names.INCOMING, blob).upload_blob(manifest(t_end), overwrite=True)
    return Ingestor(store, Settings()).ingest(blob).job_id


def agent(connection: str, imds: ImdsStandIn, scratch: Path, max_items: int = 1) -> subprocess.Popen:
    """An agent as on an Azure VM: the watcher on, IMDS at the stand-in, polling at 5 Hz; it exits after
    ``max_items`` work items (a preempted attempt counts)."""
    env = {**os.environ, names.CONNECTION: connection, "UPWELL_NODE_ID": imds.vm_name, "UPWELL_LEASE_S": "30",
           "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "UPWELL_SCRATCH": str(scratch),
           "UPWELL_EVICTION_WATCH": "1", "UPWELL_IMDS_URL": imds.url, "UPWELL_EVICTION_POLL_S": "0.2"}
    return subprocess.Popen([sys.executable, "-m", "workers.agent", "--pool", POOL, "--max-items", str(max_items),
                             "--idle-exit", "30"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)


def wait(predicate, timeout: float, what: str):
    return wait_for(predicate, timeout, what, lambda: "", poll_s=0.2)


def running(ledger: Ledger, job_id: str) -> bool:
    return getattr(ledger.shard(job_id, "s00000"), "status", None) == "running"


def started(connection: str, imds: ImdsStandIn, scratch: Path, ledger: Ledger, job_id: str,
            max_items: int = 1) -> tuple[subprocess.Popen, int]:
    """An agent on the stand-in's VM, once its shard runs and has written a first periodic checkpoint, and
    that checkpoint's step: the shard may resume from no earlier one."""
    proc = agent(connection, imds, scratch, max_items)
    wait(lambda: running(ledger, job_id), 60, "the shard to start")
    progress = wait(lambda: list(scratch.glob("upwell-*/work/ckpt/progress.json")), 120, "a first periodic checkpoint")
    return proc, int(json.loads(progress[0].read_text())["marker"])


def finished(proc: subprocess.Popen, timeout: float = 240) -> str:
    out = proc.communicate(timeout=timeout)[0].decode()
    assert proc.returncode == 0, out[-3000:]
    return out


def gone(proc: subprocess.Popen) -> str:
    """The VM goes under an agent waiting for its eviction (here: SIGTERM, as systemd stops the unit when the
    OS goes down); its output, once it exited cleanly."""
    proc.send_signal(signal.SIGTERM)
    return finished(proc, timeout=60)


def lost(store: Storage, ledger: Ledger, job_id: str) -> int:
    """Shards of the job (here one) without a succeeded result, or poisoned (collect, not run here, would
    count the result into the row)."""
    shard = ledger.shard(job_id, "s00000")
    result = json.loads(store.read(f"results/{job_id}/s00000.json"))
    return int(result["status"] != "succeeded" or shard.status in ("failed", "cancelled"))


def record(fault: str, preemptions: int, missing: int) -> None:
    harness.TABLE.append(vars(harness.Counts(fault=fault, shards=1, preemptions=preemptions, lost=missing)))


def test_a_preempt_for_another_vm_stops_nothing(azurite, tmp_path):
    store = Storage(azurite.connection_string)
    job_id = submit(store, "other-vm", t_end=0.06)
    ledger = Ledger(store)
    with ImdsStandIn("upwell-mpi-spot_0") as imds:
        imds.schedule("Preempt", ["upwell-mpi-spot_1"], notice_s=NOTICE_S)
        imds.schedule("Terminate", ["upwell-mpi-spot_2", "upwell-mpi-spot_3"], notice_s=NOTICE_S)
        proc = agent(azurite.connection_string, imds, tmp_path)
        wait(lambda: getattr(ledger.shard(job_id, "s00000"), "status", None) == "running", 60, "the shard to start")
        seen = imds.polls
        # the watcher reads the events while the payload runs, and lets it be
        wait(lambda: imds.polls > seen + 1, 60, "the watcher to read the events while the shard runs")
        out = finished(proc)
        assert imds.acks == [], "an event for another VM was acknowledged"
    assert "agent.eviction_notice" not in out and "agent.preempted" not in out, out[-3000:]
    shard = ledger.shard(job_id, "s00000")
    assert not int(shard.preemptions or 0) and not shard.failures
    assert json.loads(store.read(f"results/{job_id}/s00000.json"))["timings"]["preemptions"] == 0
    missing = lost(store, ledger, job_id)
    record("preempt for another VM", 0, missing)
    assert missing == 0


def test_a_preempt_for_this_vm_checkpoints_releases_acknowledges_and_resumes(azurite, tmp_path):
    store = Storage(azurite.connection_string)
    job_id = submit(store, "this-vm", t_end=0.12)
    ledger = Ledger(store)
    with ImdsStandIn("upwell-mpi-spot_0") as imds:
        proc, before = started(azurite.connection_string, imds, tmp_path / "a", ledger, job_id)
        assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
        event_id = imds.schedule("Preempt", ["upwell-mpi-spot_0"], notice_s=NOTICE_S)
        not_before = parsedate_to_datetime(imds.document()["Events"][0]["NotBefore"]).timestamp()
        wait(lambda: imds.acks or proc.poll() is not None, 60, "the Preempt's acknowledgement")
        # the agent waits for the VM to go, taking no work; here the VM goes as the agent is stopped
        assert proc.poll() is None, "the agent exited: on VMSS systemd would restart it every 10 s"
        out = gone(proc)
        assert "agent.eviction_notice" in out and "agent.preempted" in out, out[-3000:]
        assert "agent.eviction_wait" in out, out[-3000:]
        # acknowledged with its EventId, after the release (the loop had returned), before NotBefore
        assert imds.acks == [event_id], out[-3000:]
        assert imds.acked_at[event_id] <= not_before
    shard = ledger.shard(job_id, "s00000")
    assert shard.status == "preempted" and int(shard.preemptions) == 1 and not shard.failures
    assert [b.name for b in store.list(names.CHECKPOINTS, f"{job_id}/s00000/")], "no checkpoint was uploaded"
    peeked = store.queue(names.work_queue(POOL)).peek_messages(max_messages=1)
    assert peeked and job_id in peeked[0].content, "the message was not released at once"

    with ImdsStandIn("upwell-mpi-spot_1") as other:  # another VM of the set, with no event of its own
        out2 = finished(agent(azurite.connection_string, other, tmp_path / "b"))
        assert other.acks == [] and other.polls > 0, out2[-3000:]
    result = json.loads(store.read(f"results/{job_id}/s00000.json"))
    assert result["status"] == "succeeded", result.get("error")
    resumed = int(result["metrics"]["resumed_from_step"])
    # resumed from no earlier than the last periodic checkpoint before the notice: at most CKPT_EVERY steps lost
    assert resumed >= before > 0, (resumed, before)
    assert result["timings"]["preemptions"] == 1 and result["node"]["id"] == "upwell-mpi-spot_1"
    shard = ledger.shard(job_id, "s00000")
    assert int(shard.preemptions) == 1 and not shard.failures
    missing = lost(store, ledger, job_id)
    record("preempt for this VM", 1, missing)
    assert missing == 0
