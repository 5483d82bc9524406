"""Through the agent on Azurite: SIGTERM mid-run -> the payload checkpoints, the agent uploads the
checkpoint and makes the message visible at once -> the next attempt resumes and completes. The ledger
shows one preemption and no failure. For both heavy payloads: heat-mpi (real mpiexec) and train-torch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pipeline_helpers import wait_for
from upwell import names
from upwell.ingest.ingestor import Ingestor
from upwell.ledger import Ledger
from upwell.settings import Settings
from upwell.storage import Storage

REPO = Path(__file__).resolve().parents[2]

CASES = {
    "heat-mpi": (b"payload: heat-mpi\npool: mpi\nresources: {ranks: 2}\n"
                 b"params: {nx: 256, t_end: 0.06, checkpoint_every: 100}\ngrid: {alpha: [1.0]}\n", "mpi"),
    "train-torch": (b"payload: train-torch\npool: gpu\n"
                    b"params: {epochs: 60, hidden: 32, lr: 0.05, checkpoint_interval_s: 0}\n"
                    b"grid: {seed: [0]}\n", "gpu"),
}


def _agent(connection: str, pool: str, home: Path) -> subprocess.Popen:
    env = {**os.environ, names.CONNECTION: connection, "UPWELL_NODE_ID": f"node-{pool}",
           "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "UPWELL_LEASE_S": "30",
           "UPWELL_SCRATCH": str(home)}
    return subprocess.Popen([sys.executable, "-m", "workers.agent", "--pool", pool, "--max-items", "1",
                             "--idle-exit", "30"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)


def _wait(predicate, timeout: float, what: str, on_timeout=lambda: ""):
    return wait_for(predicate, timeout, what, on_timeout, poll_s=0.2)


@pytest.mark.parametrize("payload", sorted(CASES))
def test_sigterm_checkpoints_and_the_next_attempt_resumes(payload, azurite, tmp_path):
    manifest, pool = CASES[payload]
    store = Storage(azurite.connection_string)
    store.ensure()
    store.queue(names.work_queue(pool)).clear_messages()
    name = f"preempt/{payload}/job.yaml"
    store.blob(names.INCOMING, name).upload_blob(manifest, overwrite=True)
    job_id = Ingestor(store, Settings()).ingest(name).job_id
    ledger = Ledger(store)
    ckpt_prefix = f"{job_id}/s00000/"

    first = _agent(azurite.connection_string, pool, tmp_path)
    _wait(lambda: getattr(ledger.shard(job_id, "s00000"), "status", None) == "running", 60, "the shard to start")
    # SIGTERM once the payload has written a checkpoint of its own, so the test never races a fast run.
    _wait(lambda: list(tmp_path.glob("upwell-*/work/ckpt/progress.json")), 120, "a first checkpoint")
    assert first.poll() is None, first.stdout.read().decode()[-3000:]
    first.send_signal(signal.SIGTERM)
    out = first.communicate(timeout=60)[0].decode()
    assert first.returncode == 0, out[-3000:]
    assert "agent.preempted" in out, out[-3000:]

    shard = ledger.shard(job_id, "s00000")
    assert shard.status == "preempted" and int(shard.preemptions) == 1 and not shard.failures
    assert [b.name for b in store.list(names.CHECKPOINTS, ckpt_prefix)], "no checkpoint was uploaded"
    # Visible again at once: the next receive gets it without waiting out the lease.
    peeked = store.queue(names.work_queue(pool)).peek_messages(max_messages=1)
    assert peeked and job_id in peeked[0].content

    second = _agent(azurite.connection_string, pool, tmp_path)
    out2 = second.communicate(timeout=240)[0].decode()
    assert second.returncode == 0, out2[-3000:]
    result = json.loads(store.read(f"results/{job_id}/s00000.json"))
    assert result["status"] == "succeeded", result.get("error")
    assert result["timings"]["resumed_from"] not in (None, 0, "0"), result["timings"]
    assert result["timings"]["preemptions"] == 1
    shard = ledger.shard(job_id, "s00000")
    assert int(shard.preemptions) == 1 and not shard.failures
    if payload == "heat-mpi":
        assert result["metrics"]["l2_error"] < 1e-4 and result["metrics"]["resumed_from_step"] > 0
    else:
        assert result["metrics"]["test_accuracy"] >= 0.95 and result["metrics"]["resumed_from"] is not None
