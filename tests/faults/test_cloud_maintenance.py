"""A platform ``Reboot`` of this VM, beside a shared ``Redeploy`` days off (Scheduled Events, cloudfaults).

Played from Azure's documentation (learn.microsoft.com/azure/virtual-machines/linux/scheduled-events: a
Reboot's minimum notice is 15 minutes and a Redeploy's 10, a predicted host failure's Redeploy is often given
days; an event approved with ``StartRequests`` starts, NotBefore blank; an event that has happened is no
longer listed): a real agent on Azurite runs a ``heat-mpi`` shard on VM ``upwell-mpi_0`` with the eviction
watcher on and IMDS at the stand-in.

- A ``Redeploy`` of this VM and another, three days off, is not due: stopping now would idle the node, billed,
  for days, and approving it would move the other VM before its agent checkpointed. The payload keeps running.
- A ``Reboot`` of this VM alone, with its minimum notice: the agent checkpoints, releases the message at once,
  takes no more work and approves the reboot, so it happens now rather than in 15 minutes.
- The reboot happens (the event leaves the document) and the VM's agent starts again, as systemd or a Batch
  start task starts it after a reboot: it takes the shard and resumes it from the checkpoint, with a
  preemption and no failure counted; the Redeploy, still days off, is never acknowledged; lost = 0.

Without the watcher acting on a Reboot, the payload would be killed unwarned: the work since its last
periodic checkpoint lost, and its message held until its lease lapsed.
"""

from __future__ import annotations

import json

import pytest

from tests.faults.test_cloud_faults import POOL, agent, finished, lost, record, running, started, submit, wait
from upwell import names
from upwell.ledger import Ledger
from upwell.local.imds import ImdsStandIn
from upwell.storage import Storage

pytestmark = [pytest.mark.cloudfaults, pytest.mark.mpi]

VM, SIBLING = "upwell-mpi_0", "upwell-mpi_1"
REBOOT_NOTICE_S = 900.0  # a Reboot's documented minimum notice
DAYS_S = 3 * 86400.0


def test_a_reboot_of_this_vm_checkpoints_is_approved_and_the_vm_resumes_the_shard_once_back(azurite, tmp_path):
    store = Storage(azurite.connection_string)
    job_id = submit(store, "reboot", t_end=0.12)
    ledger = Ledger(store)
    with ImdsStandIn(VM) as imds:
        proc, before = started(azurite.connection_string, imds, tmp_path / "a", ledger, job_id)
        redeploy = imds.schedule("Redeploy", [VM, SIBLING], notice_s=DAYS_S)
        seen = imds.polls
        wait(lambda: imds.polls > seen + 2 or proc.poll() is not None, 60, "the watcher to read the Redeploy")
        assert proc.poll() is None and running(ledger, job_id), "a shared Redeploy days off stopped the agent"

        reboot = imds.schedule("Reboot", [VM], notice_s=REBOOT_NOTICE_S)
        out = finished(proc, timeout=60)
        assert "agent.eviction_notice" in out and "Reboot" in out and "agent.preempted" in out, out[-3000:]
        assert imds.acks == [reboot], out[-3000:]  # the reboot approved, never the shared Redeploy
        peeked = store.queue(names.work_queue(POOL)).peek_messages(max_messages=1)
        assert peeked and job_id in peeked[0].content, "the message was not released at once"
        shard = ledger.shard(job_id, "s00000")
        assert shard.status == "preempted" and int(shard.preemptions) == 1 and not shard.failures
        assert [b.name for b in store.list(names.CHECKPOINTS, f"{job_id}/s00000/")], "no checkpoint was uploaded"

        imds.complete(reboot)  # the VM is back; its agent starts again
        out = finished(agent(azurite.connection_string, imds, tmp_path / "after-reboot"))
        assert "agent.eviction_notice" not in out, out[-3000:]
        assert imds.acks == [reboot] and redeploy not in imds.acks, out[-3000:]
    result = json.loads(store.read(f"results/{job_id}/s00000.json"))
    assert result["status"] == "succeeded", result.get("error")
    assert int(result["metrics"]["resumed_from_step"]) >= before > 0
    assert result["timings"]["preemptions"] == 1 and result["node"]["id"] == VM
    shard = ledger.shard(job_id, "s00000")
    assert int(shard.preemptions) == 1 and not shard.failures
    missing = lost(store, ledger, job_id)
    record("reboot of this VM", 1, missing)
    assert missing == 0
