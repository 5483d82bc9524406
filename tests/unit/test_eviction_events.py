"""Which Scheduled Events this VM stops for (``workers.eviction.acted_on``, ``due``): table-driven over
documents shaped as Azure documents them (learn.microsoft.com/azure/virtual-machines/linux/scheduled-events)."""

from __future__ import annotations

import pytest

from workers.eviction import MAINTENANCE_LEAD_S, acted_on, imds_direct


def evictions(document: dict, vm: str, now: float | None = None) -> list[str]:
    """The EventIds this VM stops for."""
    return [a.event_id for a in acted_on(document, vm, now)]


def approvable(document: dict, vm: str, now: float | None = None) -> list[str]:
    """The EventIds of those that it may acknowledge."""
    return [a.event_id for a in acted_on(document, vm, now) if a.approvable]

NOW = 1474309787.0  # Mon, 19 Sep 2016 18:29:47 GMT, the documented example's NotBefore


def event(event_type: str, resources: list[str], event_id: str = "E1", status: str = "Scheduled",
          not_before: str = "Mon, 19 Sep 2016 18:29:47 GMT") -> dict:
    return {"EventId": event_id, "EventType": event_type, "ResourceType": "VirtualMachine", "Resources": resources,
            "EventStatus": status, "NotBefore": not_before, "Description": "",
            "EventSource": "Platform", "DurationInSeconds": -1}


IN_16_MIN, IN_14_MIN, IN_3_DAYS = ("Mon, 19 Sep 2016 18:45:47 GMT", "Mon, 19 Sep 2016 18:43:47 GMT",
                                   "Thu, 22 Sep 2016 18:29:47 GMT")


CASES = [
    ("preempt of this VM", [event("Preempt", ["vmss_3"])], "vmss_3", ["E1"]),
    ("terminate of this VM", [event("Terminate", ["vmss_3"])], "vmss_3", ["E1"]),
    ("preempt of another VM", [event("Preempt", ["vmss_4"])], "vmss_3", []),
    ("preempt of a VM whose name holds ours", [event("Preempt", ["vmss_31"])], "vmss_3", []),
    ("this VM among several", [event("Terminate", ["vmss_1", "VMSS_3"])], "vmss_3", ["E1"]),
    ("a freeze of this VM is no eviction", [event("Freeze", ["vmss_3"])], "vmss_3", []),
    # a Reboot or Redeploy of this VM alone: it stops now and starts the event by approving it, however far off
    ("a reboot of this VM alone", [event("Reboot", ["vmss_3"], not_before=IN_16_MIN)], "vmss_3", ["E1"]),
    ("a redeploy of this VM alone, days off (a predicted host failure)",
     [event("Redeploy", ["VMSS_3"], not_before=IN_3_DAYS)], "vmss_3", ["E1"]),
    # shared with another VM: acted on only once it is near, or Started
    ("a shared reboot 16 minutes off waits", [event("Reboot", ["vmss_3", "vmss_4"], not_before=IN_16_MIN)],
     "vmss_3", []),
    ("a shared reboot 14 minutes off", [event("Reboot", ["vmss_3", "vmss_4"], not_before=IN_14_MIN)], "vmss_3",
     ["E1"]),
    ("a shared redeploy days off waits", [event("Redeploy", ["vmss_3", "vmss_4"], not_before=IN_3_DAYS)],
     "vmss_3", []),
    ("a shared redeploy started (NotBefore blank)",
     [event("Redeploy", ["vmss_3", "vmss_4"], status="Started", not_before="")], "vmss_3", ["E1"]),
    ("a shared reboot past its NotBefore", [event("Reboot", ["vmss_3", "vmss_4"])], "vmss_3", ["E1"]),
    ("a shared reboot whose NotBefore cannot be read", [event("Reboot", ["vmss_3", "vmss_4"], not_before="soon")],
     "vmss_3", ["E1"]),
    ("a reboot of other VMs", [event("Reboot", ["vmss_4", "vmss_5"])], "vmss_3", []),
    ("only ours of two", [event("Preempt", ["a"], "E1"), event("Preempt", ["b"], "E2")], "b", ["E2"]),
    ("an event already started still evicts", [event("Preempt", ["vmss_3"], status="Started")], "vmss_3", ["E1"]),
    ("no events", [], "vmss_3", []),
    ("this VM's name unknown", [event("Preempt", ["vmss_3"])], "", []),
]


@pytest.mark.parametrize(("events", "vm", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_what_this_vm_stops_for(events, vm, expected):
    assert evictions({"DocumentIncarnation": 2, "Events": events}, vm, NOW) == expected


def test_the_lead_is_a_reboots_minimum_notice():
    assert MAINTENANCE_LEAD_S == 15 * 60
    shared = {"Events": [event("Reboot", ["vmss_3", "vmss_4"], not_before=IN_16_MIN)]}
    assert evictions(shared, "vmss_3", NOW + 60) == ["E1"]  # a minute on, it is 15 minutes off


def test_a_document_without_events_evicts_nothing():
    assert evictions({"DocumentIncarnation": 1}, "vmss_3") == []


APPROVABLE = [
    ("a scheduled terminate of this VM alone", [event("Terminate", ["vmss_3"])], ["E1"]),
    ("the name compared without case", [event("Preempt", ["VMSS_3"])], ["E1"]),
    # an acknowledgement starts the event for every VM it names: another VM's agent may still checkpoint
    ("shared with another VM", [event("Terminate", ["vmss_3", "vmss_4"])], []),
    ("already started: it needs no approval (IMDS would answer 200), and a restarted agent sends none",
     [event("Terminate", ["vmss_3"], status="Started")], []),
    ("a reboot of this VM alone, started (the VM back, the event still listed)",
     [event("Reboot", ["vmss_3"], status="Started", not_before="")], []),
    ("a freeze of this VM alone", [event("Freeze", ["vmss_3"])], []),
    ("a reboot of this VM alone", [event("Reboot", ["vmss_3"], not_before=IN_16_MIN)], ["E1"]),
    ("a shared reboot, due", [event("Reboot", ["vmss_3", "vmss_4"], not_before=IN_14_MIN)], []),
    ("ours alone beside a shared one", [event("Preempt", ["vmss_3", "x"], "E1"), event("Terminate", ["vmss_3"], "E2")],
     ["E2"]),
]


@pytest.mark.parametrize(("events", "expected"), [c[1:] for c in APPROVABLE], ids=[c[0] for c in APPROVABLE])
def test_only_an_eviction_of_this_vm_alone_is_approved(events, expected):
    assert approvable({"DocumentIncarnation": 3, "Events": events}, "vmss_3", NOW) == expected


@pytest.mark.parametrize(("environ", "expected"), [
    ({}, {}),  # no proxy: nothing added
    ({"HTTPS_PROXY": "http://proxy:3128"},
     {"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": "169.254.169.254", "no_proxy": "169.254.169.254"}),
    ({"http_proxy": "http://proxy:3128", "NO_PROXY": "10.0.0.0/8, .internal", "no_proxy": "169.254.169.254"},
     {"http_proxy": "http://proxy:3128", "NO_PROXY": "10.0.0.0/8,.internal,169.254.169.254",
      "no_proxy": "169.254.169.254"}),
    ({"HTTP_PROXY": "http://proxy:3128", "NO_PROXY": "*", "no_proxy": "*"},
     {"HTTP_PROXY": "http://proxy:3128", "NO_PROXY": "*", "no_proxy": "*"}),
], ids=["no-proxy", "proxy", "proxy-with-a-list", "proxy-bypassed-for-all"])
def test_a_proxy_in_the_environment_puts_imds_in_no_proxy(environ, expected):
    """azure-identity's managed identity reaches IMDS through the environment's proxy unless NO_PROXY names it;
    IMDS refuses proxied requests."""
    env = dict(environ)
    imds_direct(env)
    assert env == expected
