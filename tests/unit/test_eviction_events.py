"""Which Scheduled Events evict this VM (``workers.eviction.evictions``): table-driven over documents shaped
as Azure documents them (learn.microsoft.com/azure/virtual-machines/linux/scheduled-events)."""

from __future__ import annotations

import pytest

from workers.eviction import approvable, evictions


def event(event_type: str, resources: list[str], event_id: str = "E1", status: str = "Scheduled") -> dict:
    return {"EventId": event_id, "EventType": event_type, "ResourceType": "VirtualMachine", "Resources": resources,
            "EventStatus": status, "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT", "Description": "",
            "EventSource": "Platform", "DurationInSeconds": -1}


CASES = [
    ("preempt of this VM", [event("Preempt", ["vmss_3"])], "vmss_3", ["E1"]),
    ("terminate of this VM", [event("Terminate", ["vmss_3"])], "vmss_3", ["E1"]),
    ("preempt of another VM", [event("Preempt", ["vmss_4"])], "vmss_3", []),
    ("preempt of a VM whose name holds ours", [event("Preempt", ["vmss_31"])], "vmss_3", []),
    ("this VM among several", [event("Terminate", ["vmss_1", "VMSS_3"])], "vmss_3", ["E1"]),
    ("a reboot of this VM is no eviction", [event("Reboot", ["vmss_3"])], "vmss_3", []),
    ("a freeze of this VM is no eviction", [event("Freeze", ["vmss_3"])], "vmss_3", []),
    ("a redeploy of this VM is no eviction", [event("Redeploy", ["vmss_3"])], "vmss_3", []),
    ("only ours of two", [event("Preempt", ["a"], "E1"), event("Preempt", ["b"], "E2")], "b", ["E2"]),
    ("an event already started still evicts", [event("Preempt", ["vmss_3"], status="Started")], "vmss_3", ["E1"]),
    ("no events", [], "vmss_3", []),
    ("this VM's name unknown", [event("Preempt", ["vmss_3"])], "", []),
]


@pytest.mark.parametrize(("events", "vm", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_only_preempt_or_terminate_naming_this_vm_evicts(events, vm, expected):
    assert evictions({"DocumentIncarnation": 2, "Events": events}, vm) == expected


def test_a_document_without_events_evicts_nothing():
    assert evictions({"DocumentIncarnation": 1}, "vmss_3") == []


APPROVABLE = [
    ("a scheduled terminate of this VM alone", [event("Terminate", ["vmss_3"])], ["E1"]),
    ("the name compared without case", [event("Preempt", ["VMSS_3"])], ["E1"]),
    # an acknowledgement starts the event for every VM it names: another VM's agent may still checkpoint
    ("shared with another VM", [event("Terminate", ["vmss_3", "vmss_4"])], []),
    ("already started: approved again, as a restarted agent does (IMDS answers 200)",
     [event("Terminate", ["vmss_3"], status="Started")], ["E1"]),
    ("a freeze of this VM alone", [event("Freeze", ["vmss_3"])], []),
    ("ours alone beside a shared one", [event("Preempt", ["vmss_3", "x"], "E1"), event("Terminate", ["vmss_3"], "E2")],
     ["E2"]),
]


@pytest.mark.parametrize(("events", "expected"), [c[1:] for c in APPROVABLE], ids=[c[0] for c in APPROVABLE])
def test_only_an_eviction_of_this_vm_alone_is_approved(events, expected):
    assert approvable({"DocumentIncarnation": 3, "Events": events}, "vmss_3") == expected
