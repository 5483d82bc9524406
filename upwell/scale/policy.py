"""The scaling policy: pure functions, no I/O.

``decide`` works out a pool's target from what was observed; the Autoscaler
(upwell.scale.autoscaler) does the I/O. The state it carries between evaluations is
``PolicyState``; every Decision has a human-readable ``reason``.

The policy, in the order ``decide`` applies it:

0. arrivals are learned (``learn``): the jobs the ledger shows on the pool, newer than the state's last
   arrival, update the mean gap between arrivals and, where a pause longer than a boot separates them, the
   mean time between episodes of arrivals. Shards of jobs still being ingested (rows written, messages not
   all sent) count as queued (prewarm: the shard count is known before the messages are visible);
1. backlog = visible messages + in-flight shards (running tasks are demand too;
   a queue-length scaler that forgets them scales in under running work), counted in nodes: a shard of k
   nodes is k nodes' worth of slots (``in_slots``, upwell.scale.gangs), and ``Decision.gangs`` says how many
   allocations of k nodes the target holds;
2. want = ceil(demand / tasks_per_node), clamped to [min_nodes, max_nodes], where demand is the
   backlog less the queued tasks the nodes already there will start before a new node could boot
   (about boot_s / task_s per slot; see ``drain``): a node that boots after the queue emptied only
   costs its boot and idles. While arrivals keep coming (the expected gap is shorter than a boot) the
   horizon is ``STREAM_BOOTS`` boots: a queued task's wait delays the end only if nothing follows it.
   The drain only holds back new nodes, never removes one;
3. an empty pool starts only once the backlog reaches ``activation_threshold``;
4. growth is limited to ``max_step`` nodes per evaluation;
4b. fewer, longer-lived nodes: when episodes recur, new nodes are held to those that finish the backlog
   within ``EPISODE_SHARE`` of the learned time between episodes (``_episode_cap``);
5. the spot share is ``spec.spot_share``, halved while the recent preemption
   rate passes the threshold and won back step by step once it is quiet; a growing pool never asks a kind
   below the nodes of it that may be busy (``_keep_busy_kinds``);
6. the vCPU quota caps each kind of node (dedicated: the family quota; spot:
   the spot quota, whose overflow falls back to dedicated), and says so in
   ``Decision.message``;
7. the budget caps the pool at the nodes whose committed spend fits in what is
   left (dedicated nodes go first: spot buys more work per dollar);
8. shrinking: when the learned gap to the next arrival is longer than a boot, idle nodes go at once (idling
   until the next arrival costs more than booting again). Otherwise it waits for ``scale_down_votes``
   consecutive lower targets, goes to zero only after max(``cooldown_s``, expected boot time) without
   backlog (a node released sooner costs a reboot if work comes back within a boot time). It never asks
   to remove more nodes than are idle: ``Decision.removable`` says how many may go.
   A budget cap shrinks at once (still idle nodes only).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from upwell.pools.base import PoolSpec, split
from upwell.scale.gangs import Gang, allocations, extra_slots

# The preemption rate (preemptions / spot nodes exposed in the window) above
# which the spot share is halved; spec.options["preemption_threshold"] overrides.
PREEMPTION_THRESHOLD = 0.2
# Part of spec.spot_share won back per evaluation without preemptions.
SPOT_RECOVERY_STEP = 0.25
# Below this the spot share is treated as zero (no point asking for 0.3 nodes).
MIN_SPOT_SHARE = 0.05
# Weight of the newest gap in the learned mean gaps (an exponentially weighted mean).
GAP_WEIGHT = 0.3
# A pause in arrivals longer than a boot (this, while the boot time is unknown) ends an arrival episode.
QUIET_S = 300.0
# A spell without arrivals this many mean gaps long is a pause: the next arrival is then expected no sooner
# than the spell has lasted already.
QUIET_GAPS = 3.0
# The part of the learned time between episode starts that one episode's queued work is sized to take: the
# rest is slack for an episode that comes early (the instrument day's drops vary by 20 minutes in 120).
EPISODE_SHARE = 0.75
# Episodes seen (two gaps between them) before their recurrence is trusted to size the pool.
EPISODES_SEEN = 3
# While arrivals keep coming, new nodes start only for queued work the nodes there would leave waiting longer
# than this many boot times (a wait costs nothing unless no work follows; a boot always costs).
STREAM_BOOTS = 3.0


@dataclass(frozen=True)
class Observation:
    """What the autoscaler saw for one pool, this evaluation.

    Counts are nodes unless named otherwise. ``idle`` counts alive nodes that
    hold no shard (booting nodes included: they hold no work either).
    Quota fields are what is still free beyond current use; None means unknown
    (no cap). Prices are USD per node-hour.
    """

    visible: int  # visible messages on work-<pool>
    in_flight: int  # shards the ledger shows running on this pool
    nodes: int  # alive nodes: pending + idle + running
    idle: int = 0
    preempted_recent: int = 0  # preemptions seen in the recent window
    budget_left_usd: float | None = None  # None: no budget
    quota_nodes: int | None = None  # nodes the quota still allows beyond `nodes`; None: unknown
    price_per_node_hour: float = 0.0
    now: float = 0.0
    spot_nodes: int = 0  # alive spot nodes (the exposure behind preempted_recent)
    spot_price_per_node_hour: float | None = None  # None: priced as dedicated (conservative)
    quota_cores: int | None = None  # vCPUs of the dedicated family quota still free
    spot_quota_nodes: int | None = None  # spot nodes the spot quota still allows beyond spot_nodes
    cores_per_node: int = 0  # vCPUs per node, to turn quota_cores into nodes
    quota_family: str = ""  # e.g. "standardNCSv3Family", for the message
    task_s: float | None = None  # expected seconds per task (estimate or observed mean)
    boot_s: float = 0.0  # expected seconds from asking for a node to it taking work (billed)
    interval_s: float = 60.0  # seconds between evaluations
    # (time, shards) of the jobs the ledger knows on this pool (being ingested or active): decide() learns the
    # arrival pattern from those newer than PolicyState.last_arrival. Times are seconds on the ``now`` clock.
    arrivals: tuple[tuple[float, int], ...] = ()
    announced: int = 0  # shards of jobs still being ingested: rows written, messages not all visible yet
    # The shards above that take several nodes each, by their node count (upwell.scale.gangs): decide()
    # counts each as that many nodes, and says how many allocations of k nodes its target holds.
    gangs: tuple[Gang, ...] = ()

    @property
    def backlog(self) -> int:
        return self.visible + self.in_flight


@dataclass(frozen=True)
class PolicyState:
    """Carried between evaluations: shrink votes, when the backlog last emptied,
    the last target and the spot share now in force (None: spec.spot_share); and what was learned of the
    arrivals (see ``learn``): the newest arrival counted, the mean gap between arrivals within an episode,
    when the current episode began and the mean time from one episode's start to the next."""

    low_votes: int = 0
    idle_since: float | None = None
    last_target: int = 0
    spot_share: float | None = None
    last_arrival: float | None = None
    gap_s: float | None = None
    episode_start: float | None = None
    episode_gap_s: float | None = None
    episodes: int = 0  # episode starts seen


@dataclass(frozen=True)
class Decision:
    """``target`` nodes in all, split into ``spot`` + ``dedicated``. ``removable``
    idle nodes may be taken away now (target = nodes - removable when shrinking)."""

    target: int
    reason: str
    state: PolicyState
    spot: int = 0
    dedicated: int = 0
    capped_by: str = ""  # "", "budget", "quota", "max", "step", "activation"
    message: str = ""  # shown on job status, e.g. a quota shortfall
    removable: int = 0
    gangs: tuple[tuple[int, int], ...] = ()  # (k, allocations of k nodes) within target, for scale_to(gangs=)


def target(backlog: int, tasks_per_node: int, min_nodes: int, max_nodes: int) -> int:
    """ceil(backlog / tasks_per_node), clamped to [min_nodes, max_nodes]."""
    want = math.ceil(max(backlog, 0) / max(tasks_per_node, 1))
    return max(min_nodes, min(max_nodes, want))


def commit_hours(obs: Observation) -> float:
    """Hours of spend that starting a node commits us to before it can be taken back:
    it boots, then runs at least one task or one evaluation interval."""
    return (max(obs.boot_s, 0.0) + max(obs.interval_s, obs.task_s or 0.0, 1.0)) / 3600.0


def projected_usd(obs: Observation, spot: int, dedicated: int) -> float:
    """The spend that (spot, dedicated) nodes commit us to (see commit_hours)."""
    p = max(obs.price_per_node_hour, 0.0)
    ps = p if obs.spot_price_per_node_hour is None else max(obs.spot_price_per_node_hour, 0.0)
    return (dedicated * p + spot * ps) * commit_hours(obs)


def family_label(family: str) -> str:
    """"standardNCSv3Family" -> "NCSv3": how people name a quota family."""
    m = re.fullmatch(r"(?i)standard(.+?)family", family or "")
    return m.group(1) if m else (family or "vCPU")


def decide(spec: PoolSpec, obs: Observation, state: PolicyState) -> Decision:
    """The target for one pool now; pure. See the module docstring for the rules."""
    state = learn(state, obs)
    shards, obs = obs, in_slots(spec, obs)
    if obs.announced > obs.visible:
        obs = replace(obs, visible=obs.announced)
        notes = [f"backlog {obs.backlog} ({obs.visible} being ingested + {obs.in_flight} running)"]
    else:
        notes = [f"backlog {obs.backlog} ({obs.visible} queued + {obs.in_flight} running)"]
    notes[0] += f" / {max(spec.tasks_per_node, 1)} per node"
    notes += [f"{g.waiting} waiting + {g.running} running shards of {g.nodes} nodes" for g in shards.gangs]
    want, capped_by = _want(spec, obs, state, notes)
    want, capped_by = _episode_cap(spec, obs, state, want, capped_by, notes)
    share = _spot_share(spec, obs, state, notes)
    spot, ded = _keep_busy_kinds(obs, *split(want, share))
    spot, ded, message = _quota_cap(spec, obs, spot, ded, share, notes)
    if spot + ded < want:
        capped_by = "quota"
    spot, ded, budget_note = _budget_cap(spec, obs, spot, ded)
    if budget_note:
        capped_by, message = "budget", message or budget_note
        notes.append(budget_note)
    d = _settle(spec, obs, state, spot, ded, share, capped_by, message, notes)
    singles = shards.in_flight - sum(g.running for g in shards.gangs)
    held = allocations(d.target, shards.gangs, math.ceil(max(singles, 0) / max(spec.tasks_per_node, 1)))
    return replace(d, gangs=tuple(sorted(held.items())))


def in_slots(spec: PoolSpec, obs: Observation) -> Observation:
    """The observation with each k-node shard counted as k nodes' worth of task slots (upwell.scale.gangs):
    ceil(slots / tasks_per_node) is then the nodes the backlog wants."""
    if not obs.gangs:
        return obs
    tpn = spec.tasks_per_node
    return replace(obs, visible=obs.visible + extra_slots(obs.gangs, tpn, "queued"),
                   announced=obs.announced + extra_slots(obs.gangs, tpn, "announced"),
                   in_flight=obs.in_flight + extra_slots(obs.gangs, tpn, "running"))


def quiet_s(obs: Observation) -> float:
    """A pause in arrivals longer than this ends an episode: a boot time (QUIET_S while it is unknown)."""
    return obs.boot_s if obs.boot_s > 0 else QUIET_S


def _mean(old: float | None, new: float) -> float:
    return new if old is None else (1 - GAP_WEIGHT) * old + GAP_WEIGHT * new


def learn(state: PolicyState, obs: Observation) -> PolicyState:
    """The state with the arrivals newer than ``state.last_arrival`` counted, oldest first. A gap longer than
    ``quiet_s`` starts a new episode (its start's distance from the last start is averaged into
    ``episode_gap_s``); a shorter one, divided by the shards that came, is averaged into ``gap_s``."""
    new: dict[float, int] = {}
    for t, n in obs.arrivals:
        if n > 0 and (state.last_arrival is None or t > state.last_arrival):
            new[t] = new.get(t, 0) + n
    if not new:
        return state
    last, gap, start, episode_gap = state.last_arrival, state.gap_s, state.episode_start, state.episode_gap_s
    episodes = state.episodes
    for t in sorted(new):
        if last is None or t - last > quiet_s(obs):
            if start is not None:
                episode_gap = _mean(episode_gap, t - start)
            start, episodes = t, episodes + 1
        else:
            gap = _mean(gap, (t - last) / new[t])
        last = t
    return replace(state, last_arrival=last, gap_s=gap, episode_start=start, episode_gap_s=episode_gap,
                   episodes=episodes)


def expected_gap(state: PolicyState, now: float) -> float | None:
    """Seconds to the next arrival, as learned: the mean gap, or the time since the last arrival when that is
    longer already (a quiet spell that outlasts the usual gap is a pause, not a gap). None: nothing learned."""
    gap = state.gap_s if state.gap_s is not None else state.episode_gap_s
    if gap is None or state.last_arrival is None:
        return None
    since = now - state.last_arrival
    return max(gap, 0.0) if since <= QUIET_GAPS * gap else since


def _keep_busy_kinds(obs: Observation, spot: int, ded: int) -> tuple[int, int]:
    """A growing pool's split, moved so that neither kind is asked below the nodes of it that may be busy
    (min(its nodes, the busy nodes): which kind the idle nodes are is not known). A pool removes idle nodes
    only, so asking a busy kind to shrink while the other grows would take the pool past its target and past
    max_nodes; the split comes back to the share as nodes are added and idle ones go."""
    want = spot + ded
    if want < obs.nodes:
        return spot, ded
    spot_now = min(max(obs.spot_nodes, 0), obs.nodes)
    busy = obs.nodes - max(min(obs.idle, obs.nodes), 0)
    lo = min(spot_now, busy)
    hi = want - min(obs.nodes - spot_now, busy)
    s = min(max(spot, lo), hi) if lo <= hi else spot_now
    return s, want - s


def drain(spec: PoolSpec, obs: Observation, boots: float = 1.0) -> int:
    """Queued tasks the nodes already there will start within ``boots`` boot times (by default: before a node
    asked for now could boot): each slot takes about boots * boot_s / task_s of them in that time. 0 while the
    task time is unknown."""
    if not obs.task_s or obs.task_s <= 0 or obs.boot_s <= 0 or obs.nodes <= 0:
        return 0
    return int(obs.nodes * max(spec.tasks_per_node, 1) * boots * obs.boot_s / obs.task_s)


def streaming(state: PolicyState, obs: Observation) -> float | None:
    """The learned gap to the next arrival when arrivals keep coming (it is shorter than a boot), else None."""
    gap = expected_gap(state, obs.now)
    return gap if gap is not None and obs.boot_s > 0 and gap < obs.boot_s else None


def _want(spec: PoolSpec, obs: Observation, state: PolicyState, notes: list[str]) -> tuple[int, str]:
    tpn = max(spec.tasks_per_node, 1)
    # In a stream of arrivals a queued task's wait delays the end only if nothing follows it, while a new node
    # always pays its boot: new nodes are then started only for work the nodes there leave waiting longer.
    stream = streaming(state, obs)
    boots = STREAM_BOOTS if stream is not None else 1.0
    covered = min(drain(spec, obs, boots), max(obs.visible, 0))
    # The drain only holds back new nodes; it never takes away one the backlog would keep.
    demand = max(max(obs.backlog, 0) - covered, min(max(obs.backlog, 0), obs.nodes * tpn))
    covered = max(obs.backlog, 0) - demand
    raw = math.ceil(demand / tpn)
    want = target(demand, tpn, spec.min_nodes, spec.max_nodes)
    capped_by = "max" if raw > spec.max_nodes else ""
    if covered and boots > 1:
        notes.append(f"arrivals every {stream:.0f} s keep coming: {covered} queued start on the {obs.nodes} nodes"
                     f" there within {boots:g} boots")
    elif covered:
        notes.append(f"{covered} queued start on the {obs.nodes} nodes there within a boot")
    notes.append(f"wants {raw}" + (f", max {spec.max_nodes}" if capped_by else ""))
    if obs.nodes == 0 and 0 < obs.backlog < spec.activation_threshold:
        want, capped_by = spec.min_nodes, "activation"
        notes.append(f"below the activation threshold {spec.activation_threshold}")
    if want > obs.nodes + max(spec.max_step, 1):
        want, capped_by = obs.nodes + max(spec.max_step, 1), "step"
        notes.append(f"step limited to +{max(spec.max_step, 1)}")
    return want, capped_by


def _episode_cap(spec: PoolSpec, obs: Observation, state: PolicyState, want: int, capped_by: str,
                 notes: list[str]) -> tuple[int, str]:
    """Fewer, longer-lived nodes: when episodes of arrivals recur, the queued work need only be done before the
    next one is due, so new nodes beyond those that finish it by then each cost a boot for nothing.
    Never removes a node; off until EPISODES_SEEN episodes, a task time and a boot time are known."""
    if (state.episodes < EPISODES_SEEN or state.episode_gap_s is None or state.episode_start is None
            or not obs.task_s or obs.task_s <= 0
            or obs.boot_s <= 0 or want <= max(obs.nodes, spec.min_nodes)):
        return want, capped_by
    due = state.episode_start + EPISODE_SHARE * state.episode_gap_s - obs.now
    per_node = int((due - obs.boot_s) // obs.task_s)  # tasks a slot of a node asked for now runs by then
    if per_node < 2:  # a new node would run one task at most before then: the plain rule decides
        return want, capped_by
    tpn = max(spec.tasks_per_node, 1)
    # The nodes there (booting ones counted as there) run due / task_s tasks a slot by then; new ones the rest.
    held = obs.nodes * tpn * int(due // obs.task_s)
    enough = obs.nodes + math.ceil(max(obs.backlog - held, 0) / (per_node * tpn))
    capped = max(enough, spec.min_nodes)
    if capped >= want:
        return want, capped_by
    notes.append(f"episodes come every {state.episode_gap_s / 60:.0f} min: {capped} nodes finish the backlog in"
                 f" the {due / 60:.0f} min before the next is due; target {capped} not {want}")
    return capped, "episode"


def _spot_share(spec: PoolSpec, obs: Observation, state: PolicyState, notes: list[str]) -> float:
    base = min(max(spec.spot_share, 0.0), 1.0)
    if base <= 0:
        return 0.0
    share = base if state.spot_share is None else state.spot_share
    threshold = float(spec.options.get("preemption_threshold", PREEMPTION_THRESHOLD))
    exposed = obs.spot_nodes + obs.preempted_recent
    rate = obs.preempted_recent / exposed if exposed else 0.0
    if rate > threshold:
        share = share / 2 if share / 2 >= MIN_SPOT_SHARE else 0.0
        notes.append(f"preemption rate {rate:.0%} > {threshold:.0%}: spot share down to {share:.0%}")
    elif obs.preempted_recent == 0 and share < base:
        share = min(base, share + base * SPOT_RECOVERY_STEP)
        notes.append(f"no preemptions: spot share back up to {share:.0%}")
    return share


def _quota_cap(spec: PoolSpec, obs: Observation, spot: int, ded: int, share: float,
               notes: list[str]) -> tuple[int, int, str]:
    spot_now = min(max(obs.spot_nodes, 0), obs.nodes)
    ded_now = obs.nodes - spot_now
    spot_max = None if obs.spot_quota_nodes is None else spot_now + max(obs.spot_quota_nodes, 0)
    ded_max = _dedicated_room(obs)
    ded_max = None if ded_max is None else ded_now + ded_max
    message = ""
    if spot_max is not None and spot > max(spot_max, spot_now):
        moved = spot - max(spot_max, spot_now)
        spot, ded = spot - moved, ded + moved
        notes.append(f"spot quota allows {spot_max - spot_now} more: {moved} moved to dedicated")
    if ded_max is not None and ded > max(ded_max, ded_now):
        short = ded - max(ded_max, ded_now)
        message = _shortfall(spec, obs, ded - ded_now)
        ded -= short
        if share > 0 and (spot_max is None or spot < spot_max):
            room = short if spot_max is None else min(short, spot_max - spot)
            spot += room
            if room:
                notes.append(f"{room} moved to spot")
        notes.append(message)
    return spot, ded, message


def _dedicated_room(obs: Observation) -> int | None:
    rooms = []
    if obs.quota_nodes is not None:
        rooms.append(max(obs.quota_nodes, 0))
    if obs.quota_cores is not None and obs.cores_per_node > 0:
        rooms.append(max(obs.quota_cores, 0) // obs.cores_per_node)
    return min(rooms) if rooms else None


def _shortfall(spec: PoolSpec, obs: Observation, more_nodes: int) -> str:
    family = family_label(obs.quota_family)
    if obs.cores_per_node > 0 and obs.quota_cores is not None:
        return (f"pool {spec.name} needs {more_nodes * obs.cores_per_node} cores of {family} quota; "
                f"{max(obs.quota_cores, 0)} available")
    room = _dedicated_room(obs) or 0
    return f"pool {spec.name} needs {more_nodes} more nodes of {family} quota; {room} available"


def _budget_cap(spec: PoolSpec, obs: Observation, spot: int, ded: int) -> tuple[int, int, str]:
    left = obs.budget_left_usd
    if left is None or projected_usd(obs, spot, ded) <= left:
        return spot, ded, ""
    want = spot + ded
    while ded > 0 and projected_usd(obs, spot, ded) > left:
        ded -= 1
    while spot > 0 and projected_usd(obs, spot, ded) > left:
        spot -= 1
    hours = commit_hours(obs)
    return spot, ded, (f"pool {spec.name}: ${max(left, 0):.2f} of budget left covers {spot + ded} of {want} nodes"
                       f" for {hours * 60:.0f} min each")


def _settle(spec: PoolSpec, obs: Observation, state: PolicyState, spot: int, ded: int, share: float,
            capped_by: str, message: str, notes: list[str]) -> Decision:
    want = spot + ded
    idle_since = (state.idle_since if state.idle_since is not None else obs.now) if obs.backlog == 0 else None
    busy = max(obs.nodes - max(obs.idle, 0), 0)
    kept = share if spec.spot_share > 0 else None
    if want >= obs.nodes:
        notes.append(f"target {want}")
        new = _carry(state, 0, idle_since, want, kept)
        return Decision(want, "; ".join(notes), new, spot, ded, capped_by, message)
    votes = state.low_votes + 1
    needed = spec.scale_down_votes
    # Ski rental: the last node is worth keeping for as long as a new one takes to boot.
    cooldown = max(spec.cooldown_s, obs.boot_s)
    floor = want
    gap = expected_gap(state, obs.now) if obs.boot_s > 0 else None
    if gap is not None and gap >= obs.boot_s:
        # Ski rental on the learned arrivals: an idle node would wait longer for its next task than a boot
        # takes, so idling it costs more than starting one again when work comes: release it now.
        floor, votes = want, 0
        notes.append(f"next arrival expected in {gap:.0f} s, longer than a {obs.boot_s:.0f} s boot:"
                     " no idle node worth keeping")
    elif votes < needed:
        floor = obs.nodes
        notes.append(f"hold (vote {votes}/{needed} to shrink to {want})")
    elif want == 0 and (idle_since is None or obs.now - idle_since < cooldown):
        floor = min(obs.nodes, max(spec.min_nodes, 1))
        notes.append(f"keep {floor} warm until {cooldown:.0f} s without backlog")
    final = max(floor, busy)
    spot, ded = _trim(spot, ded, final, obs, share)
    final, spot, ded, note = _afford_shrink(spec, obs, final, spot, ded, busy, share)
    if note:
        capped_by, message = "budget", message or note
        notes.append(note)
    removable = obs.nodes - final
    if removable:
        notes.append(f"shrink to {final}: remove {removable} idle" + (f", {busy} busy stay" if final > want else ""))
    new = _carry(state, votes if final > want else 0, idle_since, final, kept)
    return Decision(final, "; ".join(notes), new, spot, ded, capped_by, message, removable)


def _carry(state: PolicyState, votes: int, idle_since: float | None, target: int,
           share: float | None) -> PolicyState:
    """The next state: this evaluation's votes, idle time, target and share; the learned arrivals carried."""
    return PolicyState(votes, idle_since, target, share, state.last_arrival, state.gap_s, state.episode_start,
                       state.episode_gap_s, state.episodes)


def _afford_shrink(spec: PoolSpec, obs: Observation, final: int, spot: int, ded: int, busy: int,
                   share: float) -> tuple[int, int, int, str]:
    """Lower a held or shrunk target until its committed spend fits the budget; busy nodes stay."""
    left = obs.budget_left_usd
    start = final
    while left is not None and final > busy and projected_usd(obs, spot, ded) > left:
        final -= 1
        spot, ded = _trim(*split(final, share), final, obs, share)
    if final == start:
        return final, spot, ded, ""
    return final, spot, ded, (f"pool {spec.name}: ${max(left or 0.0, 0):.2f} of budget left covers {final} "
                              f"of {start} nodes for {commit_hours(obs) * 60:.0f} min each")


def _trim(spot: int, ded: int, final: int, obs: Observation, share: float) -> tuple[int, int]:
    """The split of a shrunk target: keep the asked split where it fits, else what runs now."""
    # Shrinking only removes nodes, so each kind can only go down from what runs now.
    spot_now = min(max(obs.spot_nodes, 0), obs.nodes)
    ded_now = obs.nodes - spot_now
    s = spot if spot + ded == final else split(final, share)[0]
    s = min(max(s, final - ded_now, 0), spot_now, final)
    return s, final - s
