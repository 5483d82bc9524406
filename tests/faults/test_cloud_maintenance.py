"""A platform ``Reboot`` of this VM, beside a shared ``Redeploy`` days off, and a shared ``Reboot`` that Azure
withdraws (Scheduled Events, cloudfaults).

Played from Azure's documentation (learn.microsoft.com/azure/virtual-machines/linux/scheduled-events: a
Reboot's minimum notice is 15 minutes and a Redeploy's 10, a predicted host failure's Redeploy is often given
days; an event approved with ``StartRequests`` starts, NotBefore blank; an event stays listed, Started, until it
has reached its end, typically 10 minutes after it Started, which is the signal to recover; an operation Azure
judges too risky goes from Scheduled to no longer listed): a real agent on Azurite runs a ``heat-mpi`` shard on
VM ``upwell-mpi_0`` with the eviction watcher on and IMDS at the stand-in.

- A ``Redeploy`` of this VM and another, three days off, is not due: stopping now would idle the node, billed,
  for days, and approving it would move the other VM before its agent checkpointed. The payload keeps running.
- A ``Reboot`` of this VM alone, with its minimum notice: the agent checkpoints, releases the message at once,
  approves the reboot, so it happens now rather than in 15 minutes, and waits for it, taking no work.
- The reboot stops the agent (systemd stops its unit: SIGTERM). The VM is back and its agent starts again, as
  systemd or a Batch start task starts it, while the Reboot is still listed: it takes no work, and its row in
  the nodes table says ``maintenance`` (``Reboot``), until the event leaves the document, then resumes the
  shard from the checkpoint, with a preemption and no failure counted; the Redeploy, still days off, is never
  acknowledged; lost = 0.
- A ``Reboot`` of this VM and another, within 15 minutes of its NotBefore: the agent checkpoints and releases
  the shard, and never approves it (that would start it for the other VM too). Azure withdraws it: the same agent
  takes the shard again and finishes it; lost = 0. An agent that exited there would leave a Batch node with no
  agent, its start task ended, until the node was removed.

Without the watcher acting on a Reboot, the payload would be killed unwarned: the work since its last
periodic checkpoint lost, and its message held until its lease lapsed.
"""

from __future__ import annotations

import json

import pytest

from tests.faults.test_cloud_faults import POOL, agent, finished, gone, lost, record, running, started, submit, wait
from upwell import names
from upwell.ledger import Ledger
from upwell.local.imds import ImdsStandIn
from upwell.nodelog import NodeLog, NodeState
from upwell.storage import Storage

pytestmark = [pytest.mark.cloudfaults, pytest.mark.mpi]

VM, SIBLING = "upwell-mpi_0", "upwell-mpi_1"
REBOOT_NOTICE_S = 900.0  # a Reboot's documented minimum notice
DAYS_S = 3 * 86400.0


def released(store: Storage, ledger: Ledger, job_id: str) -> None:
    """The shard checkpointed and was preempted, and its message went back at once."""
    peeked = store.queue(names.work_queue(POOL)).peek_messages(max_messages=1)
    assert peeked and job_id in peeked[0].content, "the message was not released at once"
    shard = ledger.shard(job_id, "s00000")
    assert shard.status == "preempted" and int(shard.preemptions) == 1 and not shard.failures
    assert [b.name for b in store.list(names.CHECKPOINTS, f"{job_id}/s00000/")], "no checkpoint was uploaded"


def resumed(store: Storage, ledger: Ledger, job_id: str, before: int, fault: str) -> None:
    """The shard succeeded on this VM, resumed from its checkpoint, one preemption and no failure; lost = 0."""
    result = json.loads(store.read(f"results/{job_id}/s00000.json"))
    assert result["status"] == "succeeded", result.get("error")
    assert int(result["metrics"]["resumed_from_step"]) >= before > 0
    assert result["timings"]["preemptions"] == 1 and result["node"]["id"] == VM
    shard = ledger.shard(job_id, "s00000")
    assert int(shard.preemptions) == 1 and not shard.failures
    missing = lost(store, ledger, job_id)
    record(fault, 1, missing)
    assert missing == 0


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
        wait(lambda: imds.acks or proc.poll() is not None, 60, "the Reboot's approval")
        assert imds.acks == [reboot], "the shared Redeploy was approved"  # approved once the loop had returned
        released(store, ledger, job_id)
        assert proc.poll() is None, "the agent exited on a Reboot: the VM comes back and needs it"
        out = gone(proc)  # the reboot: systemd stops the agent's unit (docker stop)
        assert "agent.eviction_notice" in out and "Reboot" in out and "agent.preempted" in out, out[-3000:]
        assert "agent.eviction_wait" in out, out[-3000:]

        # the VM is back, its agent started again; Azure lists the Reboot, Started, until it has reached its end
        proc = agent(azurite.connection_string, imds, tmp_path / "after-reboot")
        seen = imds.polls
        wait(lambda: imds.polls > seen + 10 or proc.poll() is not None, 60, "the agent to read the listed Reboot")
        assert proc.poll() is None, "the agent started after the reboot exited while the Reboot was listed"
        assert ledger.shard(job_id, "s00000").status == "preempted", "work was taken while the Reboot was listed"
        row = NodeLog(store).get(POOL, VM)
        assert row is not None and row.state is NodeState.MAINTENANCE and row.event == "Reboot", row
        imds.complete(reboot)
        out = finished(proc)
        assert "agent.eviction_over" in out, out[-3000:]
        row = NodeLog(store).get(POOL, VM)
        assert row is not None and row.state is not NodeState.MAINTENANCE and row.event == "", row
        # approved once, before the reboot (not again by the agent that found it Started); the Redeploy never
        assert imds.acks == [reboot] and redeploy not in imds.acks, out[-3000:]
    resumed(store, ledger, job_id, before, "reboot of this VM")


def test_a_shared_reboot_that_azure_withdraws_stops_the_shard_and_the_same_agent_resumes_it(azurite, tmp_path):
    store = Storage(azurite.connection_string)
    job_id = submit(store, "withdrawn", t_end=0.12)
    ledger = Ledger(store)
    with ImdsStandIn(VM) as imds:
        proc, before = started(azurite.connection_string, imds, tmp_path / "a", ledger, job_id, max_items=2)
        reboot = imds.schedule("Reboot", [VM, SIBLING], notice_s=REBOOT_NOTICE_S - 300)  # due, shared
        wait(lambda: getattr(ledger.shard(job_id, "s00000"), "status", None) == "preempted" or proc.poll() is not None,
             60, "the shard to be checkpointed and released")
        released(store, ledger, job_id)
        assert proc.poll() is None, "the agent exited on a Reboot: the VM comes back and needs it"
        imds.complete(reboot)  # withdrawn: no longer listed
        out = finished(proc)
        for line in ("agent.eviction_notice", "agent.preempted", "agent.eviction_wait", "agent.eviction_over"):
            assert line in out, (line, out[-3000:])
        assert imds.acks == [], "a Reboot shared with another VM was approved"
    resumed(store, ledger, job_id, before, "withdrawn shared reboot")
