"""The IMDS stand-in (``upwell.local.imds``) answers as Azure documents IMDS, and the agent's IMDS client and
eviction watcher (``workers.eviction``) read it: the Metadata header and api-version are required, the
Scheduled Events document has the documented fields, and the StartRequests POST is recorded."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest

from tests.pipeline_helpers import wait_for
from upwell import logs
from upwell.local.imds import ImdsStandIn
from workers.eviction import EVENTS_API, EvictionWatcher, Imds, watched

FIELDS = {"EventId", "EventType", "ResourceType", "Resources", "EventStatus", "NotBefore", "DurationInSeconds",
          "EventSource", "Description"}


@pytest.mark.parametrize(("path", "headers"), [
    (f"/metadata/scheduledevents?api-version={EVENTS_API}", {}),
    ("/metadata/scheduledevents", {"Metadata": "true"}),
    ("/metadata/instance?api-version=2021-02-01", {"Metadata": "false"}),
])
def test_a_request_without_the_metadata_header_or_api_version_is_refused(path, headers):
    with ImdsStandIn("vm_0") as imds:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(urllib.request.Request(imds.url + path, headers=headers), timeout=5)
        assert err.value.code == 400 and "Bad request" in json.loads(err.value.read())["error"]


def test_the_documented_documents_and_the_acknowledgement():
    with ImdsStandIn("vmss_3", computer_name="vmss000003") as imds:
        client = Imds(imds.url + "/")
        assert client.vm_name() == "vmss_3"
        assert client._call("instance", "2021-02-01")["osProfile"]["computerName"] == "vmss000003"
        first = client.scheduled_events()
        event_id = imds.schedule("Preempt", ["vmss_3"], notice_s=30)
        doc = client.scheduled_events()
        assert doc["DocumentIncarnation"] > first["DocumentIncarnation"] and first["Events"] == []
        (event,) = doc["Events"]
        assert set(event) == FIELDS and event["EventStatus"] == "Scheduled" and event["NotBefore"].endswith("GMT")
        client.acknowledge([event_id])
        assert imds.acks == [event_id]
        assert client.scheduled_events()["Events"][0]["EventStatus"] == "Started"


@pytest.mark.parametrize(("resources", "acts"), [(["vmss_3"], True), (["vmss_4"], False)])
def test_the_watcher_stops_the_agent_only_for_its_own_vm(resources, acts):
    stop = threading.Event()
    with ImdsStandIn("vmss_3") as imds:
        event_id = imds.schedule("Terminate", resources)
        watcher = EvictionWatcher(Imds(imds.url), stop, poll_s=0.2, log=logs.get("upwell.test")).start()
        if acts:
            assert stop.wait(30), "the watcher did not act on its own VM's event"
        else:
            polls = imds.polls  # three more reads of the document with the other VM's event, and no stop
            wait_for(lambda: imds.polls >= polls + 3, 30, "the watcher to read the events", poll_s=0.05)
        watcher.finish()
        assert stop.is_set() is acts
        assert imds.acks == ([event_id] if acts else [])


def test_a_watcher_started_on_a_vm_already_being_evicted_stops_before_any_work():
    """A restarted agent (systemd restarts the VMSS agent) finds the acknowledged event still listed."""
    stop = threading.Event()
    with ImdsStandIn("vmss_3") as imds:
        event_id = imds.schedule("Preempt", ["vmss_3"])
        Imds(imds.url).acknowledge([event_id])
        watcher = EvictionWatcher(Imds(imds.url), stop, poll_s=0.2, log=logs.get("upwell.test")).start()
        assert stop.is_set(), "start() returned before reading Scheduled Events"
        watcher.finish()
        assert imds.acks == [event_id], "an event already Started was approved again"  # it needs none


def _agent_loop(stop: threading.Event, calls: list[bool]):
    """The lease loop as ``watched`` sees it: records whether it was stopped on entry, and returns when stopped
    (at once, if so) or, not stopped, at once as an agent with nothing to do does after its idle time."""
    def run() -> int:
        calls.append(stop.is_set())
        return 0
    return run


def _config(imds: ImdsStandIn) -> SimpleNamespace:
    return SimpleNamespace(eviction_watch=True, imds_url=imds.url, eviction_poll_s=0.2)


def test_after_a_reboot_the_agent_waits_while_the_event_is_listed_then_runs_again():
    """Azure lists an event until it has reached its end (about 10 minutes after it Started, so after the VM is
    back): the agent started again after the reboot takes no work until then, and then takes work, where an
    agent that exited would leave a Batch node with no agent (its start task ended) and a VMSS unit restarting."""
    stop, quit_, calls, waits = threading.Event(), threading.Event(), [], []
    with ImdsStandIn("vmss_3") as imds:
        reboot = imds.schedule("Reboot", ["vmss_3"], notice_s=900)
        Imds(imds.url).acknowledge([reboot])  # approved before the reboot: listed as Started now
        done: list[int] = []
        thread = threading.Thread(target=lambda: done.append(
            watched(_agent_loop(stop, calls), _config(imds), stop, quit_, log=logs.get("upwell.test"),
                    waiting=waits.append)))
        thread.start()
        polls = imds.polls
        wait_for(lambda: imds.polls >= polls + 5, 30, "the agent to read the document while it waits", poll_s=0.05)
        assert calls == [True] and thread.is_alive(), "the agent took work, or exited, while the Reboot was listed"
        assert len(waits) >= 5 and set(map(tuple, waits)) == {("Reboot",)}  # the node's maintenance beat, told why
        imds.complete(reboot)
        thread.join(30)
        assert not thread.is_alive() and done == [0]
        assert calls == [True, False], "the agent did not take work again once the Reboot had left the document"


@pytest.mark.parametrize("event_type", ["Preempt", "Terminate"])
def test_after_an_eviction_the_agent_waits_for_the_vm_to_go_and_a_signal_ends_it(event_type):
    """The VM goes with the agent in it; until then the agent takes no work and does not exit (a VMSS unit
    would start and stop every 10 s while the event is listed). systemd or docker stopping it ends the wait."""
    stop, quit_, calls = threading.Event(), threading.Event(), []
    with ImdsStandIn("vmss_3") as imds:
        event_id = imds.schedule(event_type, ["vmss_3"])
        done: list[int] = []
        thread = threading.Thread(target=lambda: done.append(
            watched(_agent_loop(stop, calls), _config(imds), stop, quit_, log=logs.get("upwell.test"))))
        thread.start()
        wait_for(lambda: imds.acks, 30, "the acknowledgement", poll_s=0.05)
        polls = imds.polls
        wait_for(lambda: imds.polls >= polls + 5, 30, "the agent to read the document while it waits", poll_s=0.05)
        assert thread.is_alive() and calls == [True] and imds.acks == [event_id]
        quit_.set()
        stop.set()  # as the agent's SIGTERM handler does
        thread.join(30)
        assert not thread.is_alive() and done == [0] and calls == [True]


def test_a_withdrawn_terminate_lets_the_agent_take_work_again():
    stop, quit_, calls = threading.Event(), threading.Event(), []
    with ImdsStandIn("vmss_3") as imds:
        event_id = imds.schedule("Terminate", ["vmss_3", "vmss_4"], notice_s=300)  # shared: never approved
        threading.Timer(1.0, lambda: imds.complete(event_id)).start()  # Azure withdraws it
        assert watched(_agent_loop(stop, calls), _config(imds), stop, quit_, log=logs.get("upwell.test")) == 0
        assert calls == [True, False] and imds.acks == []


def test_a_signal_ends_the_wait_for_a_reboot():
    stop, quit_, calls = threading.Event(), threading.Event(), []
    with ImdsStandIn("vmss_3") as imds:
        reboot = imds.schedule("Reboot", ["vmss_3", "vmss_4"], notice_s=600)  # shared, due: never approved
        threading.Timer(1.0, lambda: (quit_.set(), stop.set())).start()  # as the agent's SIGTERM handler does
        assert watched(_agent_loop(stop, calls), _config(imds), stop, quit_, log=logs.get("upwell.test")) == 0
        assert calls == [True] and imds.acks == [] and imds.document()["Events"][0]["EventId"] == reboot


class _Recorded:
    """A logger that keeps what it was told: (level, event)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def info(self, event: str, **_) -> None:
        self.lines.append(("info", event))

    def warning(self, event: str, **_) -> None:
        self.lines.append(("warning", event))


def test_on_a_new_vm_the_watcher_waits_for_scheduled_events_to_be_enabled_without_holding_the_agent():
    """The first request for events enables Scheduled Events, and its answer may take up to two minutes (here
    9 s): the agent's start waits 5 s at most, the watcher's thread waits for the answer, warns of no unreachable IMDS,
    and then acts on an event as it comes."""
    stop, log = threading.Event(), _Recorded()
    with ImdsStandIn("vmss_3", enable_s=9.0) as imds:
        started_at = time.monotonic()
        watcher = EvictionWatcher(Imds(imds.url), stop, poll_s=0.2, log=log).start()
        assert time.monotonic() - started_at < 8.0 and not stop.is_set()
        wait_for(lambda: watcher.answered, 30, "the first answer", poll_s=0.05)
        assert time.monotonic() - started_at >= 9.0
        event_id = imds.schedule("Preempt", ["vmss_3"])
        assert stop.wait(30), "the watcher did not act on an event once Scheduled Events answered"
        watcher.finish()
    assert imds.acks == [event_id]
    assert ("info", "agent.scheduled_events_enabling") in log.lines
    assert ("warning", "agent.imds_unreachable") not in log.lines, log.lines


def test_imds_is_reached_direct_whatever_proxy_the_environment_names(monkeypatch):
    """IMDS must not be reached through a proxy (documented): a proxy named in the environment (here one that
    refuses every connection) is not used for it."""
    for key in ("HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(key, "http://127.0.0.1:9")
    for key in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(key, raising=False)
    with ImdsStandIn("vmss_3") as imds:
        event_id = imds.schedule("Preempt", ["vmss_3"])
        client = Imds(imds.url)
        assert client.vm_name() == "vmss_3"
        assert client.scheduled_events()["Events"][0]["EventId"] == event_id
        client.acknowledge([event_id])
        assert imds.acks == [event_id]


def test_imds_over_its_rate_limit_is_logged_as_throttled_and_the_watcher_still_acts():
    """IMDS refuses requests beyond 5 a second from a VM, whoever sends them, with 429 (documented): with another
    process on the VM reading IMDS 10 times a second, the watcher's reads are refused now and then; it says so
    as throttling, not as IMDS unreachable, and still acts on its VM's Preempt."""
    stop, log, hog_stop = threading.Event(), _Recorded(), threading.Event()
    with ImdsStandIn("vmss_3", rate_limit=5) as imds:
        def hog() -> None:
            client = Imds(imds.url)
            while not hog_stop.wait(0.1):
                try:
                    client.vm_name()
                except OSError:
                    pass

        threading.Thread(target=hog, daemon=True).start()
        watcher = EvictionWatcher(Imds(imds.url), stop, poll_s=0.2, log=log).start()
        wait_for(lambda: ("info", "agent.imds_throttled") in log.lines, 30, "a throttled read", poll_s=0.05)
        event_id = imds.schedule("Preempt", ["vmss_3"])
        assert stop.wait(30), "the watcher did not act on its VM's Preempt while IMDS was busy"
        hog_stop.set()
        time.sleep(1.1)  # the limit's second passes: the acknowledgement goes through
        watcher.finish()
        assert imds.throttled > 0 and imds.acks == [event_id]
    assert ("warning", "agent.imds_unreachable") not in log.lines, log.lines
