"""A VMSS scale-in ``Terminate`` for this VM, with a Freeze in the same document (issue 23, cloudfaults).

Played from Azure's documentation (learn.microsoft.com/azure/virtual-machines/linux/scheduled-events: the
event types, the minimum notice per type, EventSource, DurationInSeconds, "Acknowledging an event allows the
event to proceed for all Resources in the event"; .../virtual-machine-scale-sets/
virtual-machine-scale-sets-terminate-notification: a scale-in of a set with ``terminateNotificationProfile``
gives a ``Terminate`` whose NotBefore is the configured ``notBeforeTimeout``, 5 to 15 minutes, default PT5M,
and it cannot be enabled on Spot instances, so the VM here is a regular one): a real agent on Azurite runs
a ``heat-mpi`` shard on VM ``upwell-mpi_0`` (named the VMSS way: its node id is the VM's name) with the
eviction watcher on and IMDS at the stand-in.

- A ``Freeze`` for this VM (a pause of a few seconds, memory and files kept: no action is needed) is read
  and left alone: the payload keeps running, nothing is acknowledged.
- Then a ``Terminate`` (EventSource ``User``, five minutes' notice): the agent checkpoints, releases the
  message at once, takes no more work and waits for the VM to go (an agent started again on the VM takes
  nothing either), and the shard resumes on ``upwell-mpi_1`` from its checkpoint with a preemption and no
  failure counted; lost = 0.
- The acknowledgement: a Terminate naming this VM alone is acknowledged with its EventId only (never the
  Freeze's); one naming this VM and another (one scale-in of two instances) is never acknowledged, since
  approving it would start the other VM's deletion before its own agent checkpointed: it starts at its
  NotBefore instead.
"""

from __future__ import annotations

import json

import pytest

from tests.faults.test_cloud_faults import POOL, agent, finished, gone, lost, record, running, started, submit, wait
from upwell import names
from upwell.ledger import Ledger
from upwell.local.imds import ImdsStandIn
from upwell.storage import Storage

pytestmark = [pytest.mark.cloudfaults, pytest.mark.mpi]

VM, SIBLING = "upwell-mpi_0", "upwell-mpi_2"
TERMINATE_NOTICE_S = 300.0  # notBeforeTimeout PT5M, the documented default
FREEZE_NOTICE_S = 900.0  # a Freeze's documented minimum notice


@pytest.mark.parametrize("resources", [[VM], [VM, SIBLING]], ids=["this-vm-alone", "this-vm-and-another"])
def test_terminate_checkpoints_releases_and_resumes_a_freeze_is_left_alone(azurite, tmp_path, resources):
    store = Storage(azurite.connection_string)
    job_id = submit(store, f"terminate-{len(resources)}", t_end=0.12)
    ledger = Ledger(store)
    with ImdsStandIn(VM) as imds:
        proc, before = started(azurite.connection_string, imds, tmp_path / "a", ledger, job_id)
        imds.schedule("Freeze", [VM, SIBLING], notice_s=FREEZE_NOTICE_S, duration_s=5)
        seen = imds.polls
        wait(lambda: imds.polls > seen + 1 or proc.poll() is not None, 60, "the watcher to read the Freeze")
        assert proc.poll() is None and running(ledger, job_id), "a Freeze stopped the agent"
        terminate = imds.schedule("Terminate", resources, notice_s=TERMINATE_NOTICE_S, source="User")
        wait(lambda: getattr(ledger.shard(job_id, "s00000"), "status", None) == "preempted" or proc.poll() is not None,
             60, "the shard to be checkpointed and released")
        peeked = store.queue(names.work_queue(POOL)).peek_messages(max_messages=1)
        assert peeked and job_id in peeked[0].content, "the message was not released at once"
        if resources == [VM]:
            wait(lambda: imds.acks or proc.poll() is not None, 60, "the Terminate's acknowledgement")
        # the agent waits for the VM to go, taking no work (on VMSS it is not restarted every 10 s meanwhile)
        seen = imds.polls
        wait(lambda: imds.polls > seen + 5 or proc.poll() is not None, 60, "the agent to wait")
        assert proc.poll() is None, "the agent exited while its VM's Terminate was listed"
        out = gone(proc)
        assert "agent.eviction_notice" in out and "agent.preempted" in out, out[-3000:]
        assert "agent.eviction_wait" in out, out[-3000:]
        assert imds.acks == ([terminate] if resources == [VM] else []), out[-3000:]
        # an agent started again on the VM being deleted (after a crash, say) takes no work and approves nothing
        # more (the event is Started, or shared)
        again = agent(azurite.connection_string, imds, tmp_path / "again")
        seen = imds.polls
        wait(lambda: imds.polls > seen + 5 or again.poll() is not None, 60, "the agent started again to wait")
        again_out = gone(again)
        assert "agent.eviction_notice" in again_out and "agent.run" not in again_out, again_out[-3000:]
        assert imds.acks == ([terminate] if resources == [VM] else []), again_out[-3000:]
    shard = ledger.shard(job_id, "s00000")
    assert shard.status == "preempted" and int(shard.preemptions) == 1 and not shard.failures
    assert [b.name for b in store.list(names.CHECKPOINTS, f"{job_id}/s00000/")], "no checkpoint was uploaded"

    with ImdsStandIn("upwell-mpi_1") as other:  # another VM of the set, with no event of its own
        finished(agent(azurite.connection_string, other, tmp_path / "b"))
        assert other.acks == []
    result = json.loads(store.read(f"results/{job_id}/s00000.json"))
    assert result["status"] == "succeeded", result.get("error")
    assert int(result["metrics"]["resumed_from_step"]) >= before > 0
    assert result["timings"]["preemptions"] == 1 and result["node"]["id"] == "upwell-mpi_1"
    shard = ledger.shard(job_id, "s00000")
    assert int(shard.preemptions) == 1 and not shard.failures
    missing = lost(store, ledger, job_id)
    record(f"terminate, {'alone' if resources == [VM] else 'shared'}", 1, missing)
    assert missing == 0
