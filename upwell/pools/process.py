"""The local pool: agent processes on this machine, one per "node".

State lives on disk under ``state_dir/<pool>/`` so that any LocalPool object (the
scale function builds one per process) sees the same workers: ``<id>.pid`` is
written at spawn, ``<id>.json`` by the agent itself (idle | running | stopped),
and ``<id>.stopping`` marks a worker asked to drain. Scale-in only drains idle
workers (SIGUSR1), and never one in ``busy``: a busy worker is never killed by the scaler.

A worker's agent beats as node ``local-<id>`` (upwell.nodelog). By id (``remove``): a dead agent (a hung
process) is killed with everything it started, and its leases come back through visibility; ``drain``
sends SIGUSR1, so the agent finishes what it holds, says ``drained`` and exits.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from upwell import REPO
from upwell.pools.base import (
    Busy,
    Gangs,
    NodeState,
    PoolSpec,
    PoolStatus,
    WorkerPool,
    agent_slots,
    warm_idle_exit_s,
    warm_wanted,
)
from workers.gpus import node_gpus
from workers.procs import descendants  # the same /proc walk the agent uses for its strays

REPO = REPO
_CHILDREN: dict[int, subprocess.Popen] = {}  # reaped in status(); processes outlive nothing but this process


def node_id(wid: str) -> str:
    """The node id a worker's agent beats and records as (UPWELL_NODE_ID)."""
    return f"local-{wid}"


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def default_state_dir() -> Path:
    return Path(os.environ.get("UPWELL_STATE_DIR") or (Path.cwd() / ".upwell" / "pools"))


def _alive(pid: int) -> bool:
    child = _CHILDREN.get(pid)
    if child is not None:
        if child.poll() is None:
            return True
        _CHILDREN.pop(pid, None)
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:  # a zombie whose parent is gone still answers kill(0)
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def gpu_share(gpus: list[str], index: int, nodes: int) -> list[str]:
    """The GPUs of this machine that local node ``index`` (from 1) of a pool of up to ``nodes`` is given: with
    as many GPUs as nodes or more, every ``nodes``-th from its own, so the nodes never share one; with fewer,
    one, round robin. Every local node is an agent process on the same machine, and each gives its own list out
    to its slots: without a share of its own, two nodes would both give their first shards GPU 0."""
    nodes = max(1, nodes)
    if len(gpus) >= nodes:
        return gpus[(index - 1) % nodes::nodes]
    return [gpus[(index - 1) % len(gpus)]]


class LocalPool(WorkerPool):
    """Local agent processes. Keeps only its spec, its state folder and the spawn settings."""

    expected_boot_s = 2.0  # a Python process importing the agent
    removes_by_id = True

    translate_table = {"starting": NodeState.PENDING, "idle": NodeState.IDLE, "running": NodeState.RUNNING,
                       "stopping": NodeState.STOPPING, "stopped": NodeState.STOPPING}

    def __init__(self, spec: PoolSpec, state_dir: Path | None = None, *, idle_exit_s: float = 120.0,
                 env: dict[str, str] | None = None):
        super().__init__(spec)
        self.dir = Path(state_dir or default_state_dir()) / spec.name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = self.dir.parent.parent / "logs"
        self.idle_exit_s = idle_exit_s
        self.env = env
        self._gpus: list[str] | None = None  # this machine's GPUs, listed at the first spawn

    # -- observation -----------------------------------------------------------------
    def _workers(self) -> dict[str, tuple[int, str]]:
        """worker id -> (pid, native state), forgetting workers that have exited."""
        found = {}
        for pidfile in self.dir.glob("*.pid"):
            wid = pidfile.stem
            try:
                pid = int(pidfile.read_text().strip())
            except (OSError, ValueError):
                continue
            if not _alive(pid):
                for suffix in (".pid", ".json", ".stopping", ".tmp", ".warm"):
                    (self.dir / f"{wid}{suffix}").unlink(missing_ok=True)
                continue
            state = "starting"
            try:
                state = json.loads((self.dir / f"{wid}.json").read_text()).get("state", "starting")
            except (OSError, ValueError):
                pass
            if (self.dir / f"{wid}.stopping").exists():
                state = "stopping"
            found[wid] = (pid, state)
        return found

    def status(self, *, busy: Busy = None) -> PoolStatus:
        """Each agent writes its own state (idle | running), so ``busy`` adds nothing here."""
        workers = self._workers()
        nodes = {wid: self.node_state(state) for wid, (_, state) in workers.items()}
        alive = sum(1 for s in nodes.values() if s in (NodeState.PENDING, NodeState.IDLE, NodeState.RUNNING))
        return PoolStatus(self.spec.name, target=alive, nodes=nodes, dedicated=alive)

    # -- action ----------------------------------------------------------------------
    def scale_to(self, n: int, *, spot: int | None = None, busy: Busy = None, gangs: Gangs = None) -> None:
        """Local processes are never spot; ``spot`` is ignored. Only agents that say they are
        idle are drained, and none whose node id (``local-<id>``) is in ``busy``."""
        workers = self._workers()
        live = {w: v for w, v in workers.items() if v[1] in ("starting", "idle", "running")}
        if n > len(live):
            for _ in range(n - len(live)):
                # The first min_nodes agents are warm: they never exit on idle, so an interactive job after a
                # pause starts on a running agent, not a cold one; the rest exit after idle_exit_s.
                warm = warm_wanted(self.spec, sum(1 for w in live if (self.dir / f"{w}.warm").exists())) > 0
                idle_exit = warm_idle_exit_s(self.spec) if warm else self.idle_exit_s
                live[self._spawn(set(workers), idle_exit_s=idle_exit, warm=warm)] = (0, "")
                workers = self._workers()
        elif n < len(live):
            idle = sorted((w for w, (_, s) in live.items() if s == "idle" and node_id(w) not in (busy or ())),
                          reverse=True)
            idle.sort(key=lambda w: (self.dir / f"{w}.warm").exists())  # stable: the warm ones go last
            for wid in idle[: len(live) - n]:
                pid = live[wid][0]
                (self.dir / f"{wid}.stopping").touch()
                try:
                    os.kill(pid, signal.SIGUSR1)
                except ProcessLookupError:
                    pass

    def _spawn(self, taken: set[str], *, idle_exit_s: float, warm: bool = False) -> str:
        index = 1
        while f"{self.spec.name}-{index}" in taken:
            index += 1
        wid = f"{self.spec.name}-{index}"
        env = dict(self.env if self.env is not None else os.environ)
        env.update(UPWELL_NODE_ID=node_id(wid), UPWELL_STATE_FILE=str(self.dir / f"{wid}.json"),
                   UPWELL_POOL=self.spec.name, UPWELL_VM_SIZE=self.spec.vm_size, PYTHONUNBUFFERED="1",
                   UPWELL_SLOTS=str(agent_slots(self.spec)))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
        if self._gpus is None:
            self._gpus = node_gpus(env)
        if self._gpus:  # each local node its own share of the machine's GPUs (workers.gpus gives them out)
            env["UPWELL_GPUS"] = ",".join(gpu_share(self._gpus, index, self.spec.max_nodes))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        logfile = open(self.log_dir / f"worker-{wid}.log", "ab")  # noqa: SIM115 - handed to the child
        proc = subprocess.Popen([sys.executable, "-m", "workers.agent", "--pool", self.spec.name,
                                 "--idle-exit", str(idle_exit_s)], cwd=REPO, env=env, stdout=logfile,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        logfile.close()
        _CHILDREN[proc.pid] = proc
        (self.dir / f"{wid}.json").unlink(missing_ok=True)
        (self.dir / f"{wid}.stopping").unlink(missing_ok=True)
        (self.dir / f"{wid}.warm").unlink(missing_ok=True)
        if warm:
            (self.dir / f"{wid}.warm").touch()
        (self.dir / f"{wid}.pid").write_text(str(proc.pid))
        return wid

    def remove(self, node_ids, *, dead: bool = False) -> None:
        """Dead: SIGKILL the agent and everything it started (SIGKILL ends a stopped process too); drained:
        SIGTERM an agent still exiting (it holds nothing). A worker already gone is skipped."""
        workers = self._workers()
        for wid, (pid, _) in workers.items():
            if node_id(wid) not in node_ids:
                continue
            if dead:
                for child in [*descendants(pid), pid]:
                    _signal(child, signal.SIGKILL)
            else:
                _signal(pid, signal.SIGTERM)
        for pid in [p for w, (p, _) in workers.items() if node_id(w) in node_ids]:
            child = _CHILDREN.get(pid)
            if child is not None and dead:
                child.wait(timeout=10)  # reaped, so that status() no longer lists it
        self._workers()

    def drain(self, node_ids) -> None:
        """SIGUSR1 to these agents: each finishes what it holds, beats ``drained`` and exits."""
        for wid, (pid, _) in self._workers().items():
            if node_id(wid) in node_ids:
                _signal(pid, signal.SIGUSR1)

    def close(self, timeout: float = 15.0) -> None:
        """Stop every worker: SIGTERM (running payloads checkpoint), then SIGKILL after timeout."""
        workers = self._workers()
        for pid, _ in workers.values():
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(_alive(pid) for pid, _ in workers.values()):
            time.sleep(0.1)
        for pid, _ in workers.values():
            if _alive(pid):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self._workers()
