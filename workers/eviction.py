"""The eviction watcher: Azure's Scheduled Events, read from inside the node, turned into a preemption.

On an Azure node (Batch or VMSS; the pool's agent environment sets ``UPWELL_EVICTION_WATCH``, see
``upwell.pools.azure_common.AZURE_VM_ENV``) the agent polls IMDS ``/metadata/scheduledevents`` every
``eviction_poll_s`` (bounded below, so the rate is bounded; the first request for events enables Scheduled
Events on a new VM and may take two minutes to answer, which the watcher's thread waits for while the agent
works, ``FIRST_ANSWER_S``). Scheduled Events go to every VM of an
availability set or a scale set's placement group, so an event is acted on only when its ``Resources`` name
this VM (``compute.name`` from IMDS instance metadata, the name Scheduled Events use) and it is one of:

- a ``Preempt`` (spot eviction, at least 30 s notice) or a ``Terminate`` (scale-in, delete): the VM goes
  for good;
- a ``Reboot`` or a ``Redeploy`` (platform maintenance, a predicted host failure, or a user's restart: the VM
  stops and comes back, a Redeploy on another host with its temporary disk lost; at least 15 and 10 minutes'
  notice, a predicted failure's Redeploy often days) that is due (``due``): it names this VM alone, so the
  VM can start it at once by approving it once its work is checkpointed (back sooner, and what Azure advises
  for a predicted failure); or it has Started; or its NotBefore is within ``MAINTENANCE_LEAD_S``. A shared
  one further off changes nothing yet: stopping then would idle the node, billed, until the event. Without
  the watcher a reboot kills the payload unwarned: the work since its last periodic checkpoint is lost and
  its message waits out its lease.

Then the watcher sets the agent's stop event, the same path as SIGTERM (payloads checkpoint, messages go back
at once, a preemption is recorded, the lease loop takes no more work); ``finish`` acknowledges the event with
the documented ``{"StartRequests": [{"EventId": ...}]}`` POST once the loop has returned, that is once every
attempt in hand settled and its checkpoint is uploaded, but only an event that names this VM alone (an
acknowledgement starts the event for every VM it names) and has not Started yet (``Acted.approvable``).

Then the agent does not exit (``watched``): it waits, taking no work, until no event it stops for is listed,
then takes work again under a fresh watcher. An event leaves the document once it has reached its end, which
Azure documents as the signal to recover, or when Azure withdraws it (documented as rare). After a Preempt or a
Terminate the VM goes, and the agent with it. After a Reboot or a Redeploy the VM comes back and its agent
must run there again: the event stays listed, Started, until typically about 10 minutes after it Started, so
minutes after the VM is back and its agent started again (a Batch start task runs again on every reboot;
VMSS's systemd starts the unit); that agent reads the event first and waits the same way. Were the agent to
exit instead, a Batch node's start task would end with it, the node staying in the pool, billed, with no
agent until it was removed, and a VMSS unit would start and stop every 10 s while the event is listed (up to
15 minutes for a scale-in's Terminate). Events for other VMs, ``Freeze`` (a pause of seconds, memory and
files kept) and a shared maintenance event not yet due change nothing and are never acknowledged.

Followed: learn.microsoft.com/azure/virtual-machines/linux/scheduled-events (the document, the event types
and their minimum notice, "Resources", NotBefore (RFC 1123, blank once Started), an event removed from the
document once it completed or was cancelled (typically 10 minutes after it Started), the Metadata header,
the StartRequests acknowledgement) and .../instance-metadata-service (``/metadata/instance``,
``compute.name``). Locally no watcher runs unless a test turns the setting on.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, MutableMapping
from email.utils import parsedate_to_datetime
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from workers.agent_config import AZURE_IMDS

EVICTING = frozenset({"Preempt", "Terminate"})  # the VM goes for good
MAINTENANCE = frozenset({"Reboot", "Redeploy"})  # the VM stops and comes back
# A shared Reboot or Redeploy is acted on this long before its NotBefore: a Reboot's documented minimum notice,
# so one given the minimum is acted on when it appears, and one given days waits until then.
MAINTENANCE_LEAD_S = 900.0
EVENTS_API = "2020-07-01"
INSTANCE_API = "2021-02-01"
MIN_POLL_S = 0.2  # the bound on the polling rate (Azure's samples poll about once a second)
HTTP_TIMEOUT_S = 5.0
# Scheduled Events is enabled for a VM by its first request for events, whose answer may take up to two minutes
# (and events come within five): the watcher's thread waits that long for its first answer.
FIRST_ANSWER_S = 150.0


def due(event: dict[str, Any], alone: bool, now: float, lead_s: float = MAINTENANCE_LEAD_S) -> bool:
    """A Reboot or Redeploy naming this VM that it acts on now: one naming it ``alone`` (the VM starts it by
    approving it), one Started, or one whose NotBefore is ``lead_s`` away or less (a NotBefore blank or
    unreadable counts as now)."""
    if event.get("EventType") not in MAINTENANCE:
        return False
    if alone or event.get("EventStatus") == "Started":
        return True
    try:
        not_before = parsedate_to_datetime(str(event.get("NotBefore") or "")).timestamp()
    except (TypeError, ValueError):
        return True
    return not_before - now <= lead_s


class Acted(NamedTuple):
    """An event this VM stops for: its EventId, its EventType, whether it names this VM alone and whether it
    has Started, which decide whether the VM acknowledges it (``approvable``). An acknowledgement lets an event
    proceed for every VM in its Resources, not only the one that sends it (the documented note under "Start an
    event"): approving a Terminate, Preempt, Reboot or Redeploy shared with other VMs could take them down
    before their own agents checkpointed. Such an event starts at its NotBefore instead. One that has Started
    needs no approval (IMDS would answer 200 and nothing more): an agent started again during a reboot's
    event, which stays listed until about 10 minutes after it Started, does not send one."""

    event_id: str
    kind: str
    alone: bool
    started: bool = False

    @property
    def approvable(self) -> bool:
        return self.alone and not self.started


def acted_on(document: dict[str, Any], vm_name: str, now: float | None = None,
             lead_s: float = MAINTENANCE_LEAD_S) -> list[Acted]:
    """The events in a Scheduled Events document that this VM stops for: Preempt or Terminate events whose
    Resources name ``vm_name`` (Azure's VM names are case-insensitive), and Reboot or Redeploy events naming
    it that are ``due`` at ``now`` (epoch seconds; the clock's). No name, no event concerns us."""
    if not vm_name:
        return []
    me, at, out = vm_name.casefold(), time.time() if now is None else now, []
    for event in document.get("Events") or []:
        names = {str(r).casefold() for r in event.get("Resources") or []}
        alone = names == {me}
        if me in names and (event.get("EventType") in EVICTING or due(event, alone, at, lead_s)):
            out.append(Acted(str(event.get("EventId", "")), str(event.get("EventType")), alone,
                             event.get("EventStatus") == "Started"))
    return out


def kinds(acted: list[Acted]) -> list[str]:
    """The event types among ``acted``, sorted, once each: what the log and the node's maintenance beat name."""
    return sorted({a.kind for a in acted})


class Imds:
    """IMDS at ``base_url`` (Azure's: http://169.254.169.254): every request carries ``Metadata: true`` and goes
    direct, whatever proxy the environment names (IMDS must not be reached through a proxy: documented)."""

    def __init__(self, base_url: str) -> None:
        self.base = base_url.rstrip("/")
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def _call(self, path: str, api: str, body: dict[str, Any] | None = None,
              timeout: float = HTTP_TIMEOUT_S) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.base}/metadata/{path}?api-version={api}", data=data,
                                     headers={"Metadata": "true", "Content-Type": "application/json"})
        # the base URL is a setting: IMDS on Azure, the stand-in in tests
        with self._opener.open(req, timeout=timeout) as resp:
            text = resp.read()
        return json.loads(text) if text.strip() else {}

    def vm_name(self) -> str:
        return str(self._call("instance", INSTANCE_API).get("compute", {}).get("name", ""))

    def scheduled_events(self, timeout: float = HTTP_TIMEOUT_S) -> dict[str, Any]:
        return self._call("scheduledevents", EVENTS_API, timeout=timeout)

    def acknowledge(self, event_ids: list[str]) -> None:
        self._call("scheduledevents", EVENTS_API, {"StartRequests": [{"EventId": i} for i in event_ids]})


class EvictionWatcher:
    """Polls Scheduled Events on its own thread until an eviction of this VM or ``finish``.

    State: the IMDS client, the agent's stop event, the VM's name once read, whether Scheduled Events has
    answered yet, and the events it acted on."""

    def __init__(self, imds: Imds, stop: threading.Event, *, poll_s: float, log: Any) -> None:
        self.imds, self.stop, self.log = imds, stop, log
        self.poll_s = max(MIN_POLL_S, poll_s)
        self.vm_name = ""
        self.answered = False
        self.acted: list[Acted] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="eviction-watcher")

    def start(self) -> EvictionWatcher:
        """Poll once before the agent takes any work (an agent restarted on a VM already being evicted stops
        at once: an acknowledged event stays listed, Started, until the VM goes), then on the thread. The
        first poll waits ``HTTP_TIMEOUT_S`` at most: on a new VM, where the first request enables Scheduled
        Events and its answer is slow, the thread waits for it (``FIRST_ANSWER_S``) while the agent works."""
        if not self._poll(HTTP_TIMEOUT_S):
            self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._done.wait(self.poll_s) and not self.stop.is_set():
            if self._poll(HTTP_TIMEOUT_S if self.answered else FIRST_ANSWER_S):
                return

    @property
    def pending(self) -> list[str]:
        """The EventIds of the events acted on that this VM approves (``Acted.approvable``), by ``finish``."""
        return [a.event_id for a in self.acted if a.approvable]

    def _read(self, timeout: float = HTTP_TIMEOUT_S) -> list[Acted] | None:
        """One read of Scheduled Events: the events this VM stops for, or None when IMDS could not be read (the
        next poll tries again). A refusal over IMDS's rate limit (5 requests a second per VM, whoever sends
        them: 429) and a first read that timed out while Scheduled Events is being enabled are logged as what
        they are; anything else as IMDS unreachable."""
        try:
            self.vm_name = self.vm_name or self.imds.vm_name()
            acted = acted_on(self.imds.scheduled_events(timeout), self.vm_name)
        except (OSError, ValueError) as exc:  # IMDS unreachable, busy or garbled
            if isinstance(exc, urllib.error.HTTPError) and exc.code == 429:
                self.log.info("agent.imds_throttled")
            elif not self.answered and timeout <= HTTP_TIMEOUT_S:  # the first request for events enables them:
                self.log.info("agent.scheduled_events_enabling", error=str(exc))  # slow; the thread waits for it
            else:
                self.log.warning("agent.imds_unreachable", error=str(exc))
            return None
        self.answered = True
        return acted

    def _poll(self, timeout: float) -> bool:
        """One read of Scheduled Events; on an event this VM stops for, set the stop event and say so."""
        acted = self._read(timeout)
        if not acted:
            return False
        self.acted = acted
        self.log.warning("agent.eviction_notice", events=[a.event_id for a in acted], vm=self.vm_name,
                         types=kinds(acted))
        self.stop.set()  # the SIGTERM path: checkpoint, release at once, take no more work
        return True

    def finish(self) -> None:
        """After the lease loop returned (every attempt settled): acknowledge the evictions acted on."""
        self._done.set()
        if self._thread.is_alive():
            self._thread.join(timeout=HTTP_TIMEOUT_S * 2 + self.poll_s)
        pending = self.pending
        if not pending:
            return
        try:
            self.imds.acknowledge(pending)
            self.log.info("agent.eviction_acknowledged", events=pending)
        except (OSError, ValueError) as exc:  # the platform proceeds at NotBefore anyway
            self.log.warning("agent.eviction_ack_failed", events=pending, error=str(exc))

    def over(self, quit_: threading.Event, waiting: Callable[[list[str]], None] | None = None) -> bool:
        """After ``finish``, when an event was acted on: wait, polling, until the document lists no event this
        VM stops for (the VM is back from a Reboot or a Redeploy, or Azure withdrew the event); True then. A VM
        that goes (Preempt, Terminate) takes the waiting agent with it. False at once when nothing was acted
        on, and False when ``quit_`` is set meanwhile (a signal: systemd or docker stopping the agent). An IMDS
        that does not answer is read again. ``waiting`` is told the events' types before the wait and after
        each poll that still lists one (the node's maintenance beat, which rates itself)."""
        if not self.acted:
            return False
        ids = [a.event_id for a in self.acted]
        types = kinds(self.acted)
        self.log.info("agent.eviction_wait", events=ids, vm=self.vm_name)
        while True:
            if waiting is not None:
                waiting(types)
            if quit_.wait(self.poll_s):
                return False
            listed = self._read()
            if listed:
                types = kinds(listed)
            if listed == []:
                self.log.info("agent.eviction_over", events=ids, vm=self.vm_name)
                return True


IMDS_HOST = urlsplit(AZURE_IMDS).hostname or ""
PROXY_VARS = ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy")


def imds_direct(environ: MutableMapping[str, str]) -> None:
    """Where the node's environment names a proxy (options.env, or one docker adds from its client config),
    put IMDS in NO_PROXY and no_proxy: azure-identity's managed identity asks IMDS for its tokens through the
    environment's proxy unless told otherwise there, and IMDS refuses to be reached through one."""
    if not any(environ.get(k) for k in PROXY_VARS):
        return
    for key in ("NO_PROXY", "no_proxy"):
        hosts = [h.strip() for h in environ.get(key, "").split(",") if h.strip()]
        if IMDS_HOST not in hosts and "*" not in hosts:
            environ[key] = ",".join([*hosts, IMDS_HOST])


def watched(run: Callable[[], int], config: Any, stop: threading.Event, quit_: threading.Event, *,
            log: Any, waiting: Callable[[list[str]], None] | None = None) -> int:
    """Run the agent's lease loop (``run``) under a watcher on an Azure node (``config.eviction_watch``; a
    local run polls no IMDS): after an event, once it has left the document, run the loop again under a fresh
    watcher (``EvictionWatcher.over``), until the loop ends for any other reason.
    ``quit_`` is set by the agent's signal handlers, which also set ``stop``: a signal that comes while the
    loop is cleared to run again is not lost. ``waiting``: told the events' types while the agent waits
    (``EvictionWatcher.over``)."""
    while True:
        watch = (EvictionWatcher(Imds(config.imds_url), stop, poll_s=config.eviction_poll_s, log=log).start()
                 if config.eviction_watch else None)
        try:
            done = run()
        finally:
            if watch is not None:  # every attempt has settled: the eviction may be acknowledged
                watch.finish()
        if watch is None or not watch.over(quit_, waiting):
            return done
        stop.clear()
        if quit_.is_set():
            return done
