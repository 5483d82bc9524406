"""The Slurm pool: agents as Slurm jobs, on premises or on an Azure CycleCloud Slurm cluster.

One agent is one job (see upwell.pools.build_slurm for the script and why
it ``exec``s ``srun``). ``scale_to(n)`` submits jobs with ``sbatch --parsable``
or removes them: pending jobs are cancelled, idle agents are asked to drain
(``scancel --signal=USR1``: an agent that took an item in between finishes it),
and a busy agent is never touched. ``status()`` reads ``squeue`` with a fixed
``--format`` and maps Slurm's job states through ``translate_table``.

Whether a running job's agent is busy comes from the state file each agent
writes under ``state_dir/<pool>/<job id>.json`` when the pool and the nodes
share a file system (idle | running | stopped), else from the ledger (the
busy set the Autoscaler passes in: node ids running a shard; it
says "running" until collect has seen the result). A drain signal that meets an
agent which took an item after all only lets it finish; one that meets an agent
still starting ends its job before it took anything.

Gangs: ``scale_to(n, gangs={k: m})`` keeps m gang jobs of k nodes (``sbatch
--nodes=k``, one agent each, which takes only shards of k nodes) beside the
one-node agents, which fill the rest of n; gang jobs of a size the backlog no
longer wants are removed as any other (pending ones cancelled, idle agents drained,
busy ones left alone). ``status`` counts a gang job as k nodes: its agent's node id
and k - 1 more (``<agent id>+<i>``), all in the job's state.

Warm agents (issue 25 item 15): the first ``min_nodes`` one-node agent jobs run with the warm idle exit
(``options.warm_idle_exit_s``, default 0: never) instead of ``idle_exit_s``; the pool marks each with
``state_dir/<pool>/<job id>.warm`` to count them (a new warm one only while fewer live) and drains the
other idle agents first.

The pool keeps its spec, the CLI runner, the state folder and the jobs it asked
to drain (so that a second scale run does not count them twice).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from upwell import logs, names
from upwell.errors import PoolError, PoolErrorKind
from upwell.pools import build_slurm as build
from upwell.pools.base import Busy, Gangs, NodeState, PoolSpec, PoolStatus, WorkerPool, warm_idle_exit_s, warm_wanted

log = logs.get("upwell.pools.slurm")
DRAIN_S = 60.0  # how long a job asked to drain counts as leaving, not alive

# Finished for good: such jobs are no longer part of the pool at all.
FINISHED = frozenset({"COMPLETED", "CANCELLED", "TIMEOUT"})
_ALREADY_GONE = ("already completing or completed", "invalid job id", "job has already finished")
_TRANSIENT = ("unable to contact slurm controller", "socket timed out", "connection refused",
              "slurm_receive_msg", "communication connection failure", "temporarily unavailable")
_QUOTA = ("maxsubmit", "assocmax", "qosmax", "job violates accounting/qos policy")


class SlurmCli:
    """Runs Slurm's client commands. ``env``: their environment (SLURM_CONF, and what jobs inherit)."""

    def __init__(self, env: dict[str, str] | None = None, timeout_s: float = 30.0):
        self.env = env
        self.timeout_s = timeout_s

    def __call__(self, argv: list[str], stdin: str | None = None) -> str:
        try:
            done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=self.timeout_s,
                                  env=self.env, check=False)
        except FileNotFoundError:
            raise PoolError(f"{argv[0]} is not on PATH: install Slurm's client commands (Debian: "
                            "apt-get install slurm-client) on the machine that runs the scaler") from None
        except subprocess.TimeoutExpired:
            raise PoolError(f"{argv[0]} did not answer in {self.timeout_s:g}s",
                            kind=PoolErrorKind.THROTTLED, retry_after=self.timeout_s) from None
        if done.returncode != 0:
            raise translate_error(argv[0], done.stderr or done.stdout)
        return done.stdout


class CliDriver:
    """The pool's three verbs through sbatch, squeue and scancel (``run``: a SlurmCli or a stand-in)."""

    def __init__(self, run: Callable[..., str]):
        self.run = run

    def submit(self, spec: PoolSpec, script: str, *, spot: bool = False, nodes: int = 1) -> str:
        try:
            return build.parse_job_id(self.run(build.sbatch_argv(spec), script))
        except ValueError as exc:
            raise PoolError(f"sbatch: {exc}") from None

    def jobs(self, spec: PoolSpec) -> list[build.SlurmJob]:
        try:
            return build.parse_squeue(self.run(build.squeue_argv(spec)), spec)
        except ValueError as exc:
            raise PoolError(f"squeue: {exc}") from None

    def cancel(self, job_ids: list[str], *, signal: str | None = None, batch: bool = False) -> None:
        self.run(build.scancel_argv(job_ids, signal=signal, batch=batch))


class RestDriver:
    """The same verbs through slurmrestd (OpenAPI v0.0.38). ``url``: http(s)://host:port or
    unix:/path/to/socket; the JWT, when the site uses one, comes from the env var ``token_env``
    (never from settings). Keeps only the address and the credentials' names."""

    def __init__(self, url: str, *, user: str | None = None, token_env: str | None = None,
                 env: dict[str, str] | None = None, timeout_s: float = 30.0):
        self.url, self.user, self.token_env, self.timeout_s = url, user, token_env, timeout_s
        self.env = env

    def _connection(self) -> http.client.HTTPConnection:
        if self.url.startswith("unix:"):
            path, timeout = self.url[len("unix:"):], self.timeout_s

            class UnixConnection(http.client.HTTPConnection):
                def connect(self):
                    self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    self.sock.settimeout(timeout)
                    self.sock.connect(path)

            return UnixConnection("localhost", timeout=timeout)
        parts = urlsplit(self.url)
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        return cls(parts.hostname, parts.port, timeout=self.timeout_s)

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        env = self.env if self.env is not None else os.environ
        if self.user:
            headers["X-SLURM-USER-NAME"] = self.user
        if self.token_env and env.get(self.token_env):
            headers["X-SLURM-USER-TOKEN"] = env[self.token_env]
        conn = self._connection()
        try:
            conn.request(method, f"/slurm/{build.REST_API}{path}", json.dumps(body) if body is not None else None,
                         headers)
            response = conn.getresponse()
            raw = response.read()
        except OSError as exc:
            raise PoolError(f"slurmrestd at {self.url}: {exc}", kind=PoolErrorKind.THROTTLED,
                            retry_after=30.0) from None
        finally:
            conn.close()
        try:
            doc = json.loads(raw or b"{}")
        except ValueError:
            doc = {"errors": [{"error": raw[:300].decode(errors="replace")}]}
        errors = [e for e in doc.get("errors") or [] if e.get("error") or e.get("description")]
        if response.status >= 400 or errors:
            text = "; ".join(str(e.get("error") or e.get("description")) for e in errors) or f"HTTP {response.status}"
            if response.status in (401, 403):
                raise PoolError(f"slurmrestd: {text}", kind=PoolErrorKind.AUTH)
            raise translate_error("slurmrestd", text)
        return doc

    def submit(self, spec: PoolSpec, script: str, *, spot: bool = False, env: dict[str, str] | None = None,
               nodes: int = 1) -> str:
        doc = self.call("POST", "/job/submit", build.rest_job(spec, script, env or {}, spot=spot, nodes=nodes))
        if not doc.get("job_id"):
            raise PoolError(f"slurmrestd returned no job id: {str(doc)[:300]}")
        return str(doc["job_id"])

    def jobs(self, spec: PoolSpec) -> list[build.SlurmJob]:
        return build.parse_rest_jobs(self.call("GET", "/jobs"), spec)

    def cancel(self, job_ids: list[str], *, signal: str | None = None, batch: bool = False) -> None:
        query = "&".join([*([f"signal={signal}"] if signal else []), *(["flags=BATCH_JOB"] if batch else [])])
        for job in job_ids:
            self.call("DELETE", f"/job/{job}" + (f"?{query}" if query else ""))


def translate_error(command: str, stderr: str) -> PoolError:
    """A failed Slurm command as a PoolError whose kind says whether to retry."""
    text = " ".join(stderr.split())[:500]
    low = text.lower()
    if any(s in low for s in _QUOTA):
        return PoolError(f"{command}: {text}", kind=PoolErrorKind.QUOTA)
    if any(s in low for s in _TRANSIENT):
        return PoolError(f"{command}: {text}", kind=PoolErrorKind.THROTTLED, retry_after=30.0)
    if "invalid account" in low or "access denied" in low or "authentication" in low:
        return PoolError(f"{command}: {text}", kind=PoolErrorKind.AUTH)
    if "invalid partition" in low or "node configuration is not available" in low:
        return PoolError(f"{command}: {text}", kind=PoolErrorKind.CAPACITY)
    return PoolError(f"{command}: {text or 'failed with no message'}")


class SlurmPool(WorkerPool):
    """Agent jobs on a Slurm cluster; see the module docstring for the state it keeps."""

    # Slurm's job states (squeue %T), lower case. RUNNING is IDLE until the agent or the ledger says
    # it holds a shard. CONFIGURING is a CycleCloud node still booting for the job.
    expected_boot_s = 0.0  # the cluster's nodes are up (a CycleCloud nodearray that powers nodes up: options.boot_s)
    translate_table = {
        "pending": NodeState.PENDING, "configuring": NodeState.PENDING, "requeued": NodeState.PENDING,
        "requeue_hold": NodeState.PENDING, "requeue_fed": NodeState.PENDING, "resizing": NodeState.PENDING,
        "running": NodeState.IDLE,
        "suspended": NodeState.RUNNING, "stopped": NodeState.RUNNING,  # paused with its shard in hand
        "completing": NodeState.STOPPING, "signaling": NodeState.STOPPING, "stage_out": NodeState.STOPPING,
        "preempted": NodeState.PREEMPTED,
        "node_fail": NodeState.FAILED, "boot_fail": NodeState.FAILED, "failed": NodeState.FAILED,
        "out_of_memory": NodeState.FAILED, "deadline": NodeState.FAILED, "revoked": NodeState.FAILED,
        "special_exit": NodeState.FAILED,
    }

    def __init__(self, spec: PoolSpec, state_dir: Path | None = None, *, idle_exit_s: float = 120.0,
                 env: dict[str, str] | None = None, client: Callable[..., str] | None = None):
        super().__init__(spec)
        from upwell.pools.process import default_state_dir

        shared = spec.options.get("state_dir") or state_dir or default_state_dir()
        self.state_dir = Path(shared)
        self.idle_exit_s = float(spec.options.get("idle_exit_s", idle_exit_s))
        self.env = env
        rest = spec.options.get("slurmrestd")
        if rest and client is None:
            self.driver: CliDriver | RestDriver = RestDriver(str(rest), user=spec.options.get("slurmrestd_user"),
                                                             token_env=spec.options.get("slurmrestd_token_env"),
                                                             env=env)
        else:
            self.driver = CliDriver(client or SlurmCli(env))
        self._draining: dict[str, float] = {}  # job id -> when the drain signal went

    # -- observation -----------------------------------------------------------------
    def jobs(self) -> list[build.SlurmJob]:
        return self.driver.jobs(self.spec)

    def job_state(self, job: build.SlurmJob, busy: Busy) -> NodeState:
        """One job's node state: Slurm's state, refined for a running job by the agent's state file and
        the ledger's busy set. With neither (no file, ``busy`` None) a running agent counts as busy."""
        state = self.node_state(job.state)
        if state is not NodeState.IDLE:
            return state
        agent = self._agent_state(job.job_id)
        if agent == "stopped" or self._drain_sent(job.job_id):
            return NodeState.STOPPING
        if agent == "running":
            return NodeState.RUNNING
        # The agent's own word is the freshest; the ledger says "running" until collect has run.
        if agent is None and (busy is None or build.node_id(self.spec.name, job.job_id) in busy):
            return NodeState.RUNNING
        return NodeState.IDLE

    def _agent_state(self, job_id: str) -> str | None:
        try:
            return json.loads((self.state_dir / self.spec.name / f"{job_id}.json").read_text()).get("state")
        except (OSError, ValueError, AttributeError):
            return None

    def _drain_sent(self, job_id: str) -> bool:
        sent = self._draining.get(job_id)
        return sent is not None and time.monotonic() - sent < DRAIN_S

    def _observe(self, busy: Busy) -> tuple[list[build.SlurmJob], dict[str, NodeState]]:
        jobs = [j for j in self.jobs() if j.state not in FINISHED]
        return jobs, {j.job_id: self.job_state(j, busy) for j in jobs}

    def status(self, *, busy: Busy = None) -> PoolStatus:
        jobs, nodes = self._observe(busy)
        alive = [j for j in jobs if nodes[j.job_id] in _ALIVE]
        spot = sum(j.size for j in alive if build.is_spot(self.spec, j.partition))
        preempted = sum(1 for j in jobs if nodes[j.job_id] is NodeState.PREEMPTED
                        or (j.state == "NODE_FAIL" and build.is_spot(self.spec, j.partition)))
        pending = [j for j in alive if nodes[j.job_id] is NodeState.PENDING and j.reason not in _ROUTINE]
        message = f"{len(pending)} agent job(s) pending: {pending[0].reason}" if pending else ""
        by_node = {}  # the agents' node ids, and a gang job's other nodes after its agent's
        for j in jobs:
            agent = build.node_id(self.spec.name, j.job_id)
            by_node.update({agent if i == 0 else f"{agent}+{i}": nodes[j.job_id] for i in range(max(1, j.size))})
        total = sum(j.size for j in alive)
        return PoolStatus(self.spec.name, target=total, nodes=by_node, spot=spot, dedicated=total - spot,
                          preempted=preempted, message=message)

    # -- action ----------------------------------------------------------------------
    def scale_to(self, n: int, *, spot: int | None = None, busy: Busy = None, gangs: Gangs = None) -> None:
        """Keep the gang jobs ``gangs`` asks for, then one-node agents up to the rest of n (submit, or remove
        pending jobs, then idle agents); busy ones stay."""
        jobs, nodes = self._observe(busy)
        alive = [j for j in jobs if nodes[j.job_id] in _ALIVE]
        wanted = {int(k): int(m) for k, m in (gangs or {}).items() if int(k) > 1 and int(m) > 0}
        self._scale_gangs(wanted, alive, nodes)
        singles = [j for j in alive if j.size <= 1]
        n = max(0, n - sum(k * m for k, m in wanted.items()))
        if n > len(singles):
            live_spot = sum(1 for j in singles if build.is_spot(self.spec, j.partition))
            want_spot = self._spot_target(n, spot)
            new_spot = min(max(0, want_spot - live_spot), n - len(singles))
            warm = warm_wanted(self.spec, sum(1 for j in singles if self._warm(j.job_id)))
            for k in range(n - len(singles)):
                self.submit(spot=k < new_spot, warm=k < warm)
        elif n < len(singles):
            self._shrink(singles, nodes, len(singles) - n)

    def _scale_gangs(self, wanted: dict[int, int], alive: list[build.SlurmJob], nodes: dict[str, NodeState]) -> None:
        """Gang jobs of each size up to what ``wanted`` asks (k -> how many); of a size wanted less or not at
        all, pending ones cancelled and idle ones drained (``_shrink``); busy ones stay."""
        for size in sorted(set(wanted) | {j.size for j in alive if j.size > 1}):
            have = [j for j in alive if j.size == size]
            want = wanted.get(size, 0)
            for _ in range(want - len(have)):
                self.submit(nodes=size)
            if want < len(have):
                self._shrink(have, nodes, len(have) - want)

    def _spot_target(self, n: int, spot: int | None) -> int:
        if self.spec.options.get("spot"):
            return n  # the whole partition is spot
        if not self.spec.options.get("spot_partition"):
            return 0
        return min(n, spot if spot is not None else round(n * self.spec.spot_share))

    def _shrink(self, alive: list[build.SlurmJob], nodes: dict[str, NodeState], k: int) -> None:
        newest = sorted(alive, key=lambda j: int(j.job_id) if j.job_id.isdigit() else 0, reverse=True)
        newest.sort(key=lambda j: self._warm(j.job_id))  # stable: the warm agents go last
        pending = [j.job_id for j in newest if nodes[j.job_id] is NodeState.PENDING][:k]
        idle = [j.job_id for j in newest if nodes[j.job_id] is NodeState.IDLE][: k - len(pending)]
        if pending:
            self._cancel(pending)
        if idle:
            gangs = {j.job_id for j in alive if j.size > 1}  # their agent is the batch step (build_slurm)
            for batch in (False, True):
                chosen = [j for j in idle if (j in gangs) is batch]
                if chosen:
                    self._cancel(chosen, signal="USR1", batch=batch)
            now = time.monotonic()
            self._draining.update({job: now for job in idle})
        log.info("slurm.scale_in", pool=self.spec.name, cancelled=pending, drained=idle,
                 kept_busy=sum(1 for s in nodes.values() if s is NodeState.RUNNING))

    def _cancel(self, job_ids: list[str], *, signal: str | None = None, batch: bool = False) -> None:
        try:
            self.driver.cancel(job_ids, signal=signal, batch=batch)
        except PoolError as exc:
            if not any(s in str(exc).lower() for s in _ALREADY_GONE):
                raise

    def submit(self, *, spot: bool = False, nodes: int = 1, warm: bool = False) -> str:
        """One agent job (``nodes`` > 1: a gang job of that many nodes); returns its id. ``warm``: one of
        the first ``min_nodes`` agents, whose idle exit is the pool's warm one (default never), marked
        ``<state_dir>/<pool>/<job>.warm`` so the pool counts it and drains it last."""
        idle_exit = warm_idle_exit_s(self.spec) if warm else self.idle_exit_s
        script = build.batch_script(self.spec, idle_exit_s=idle_exit, state_dir=str(self.state_dir),
                                    spot=spot, nodes=nodes)
        if isinstance(self.driver, RestDriver):
            job_id = self.driver.submit(self.spec, script, spot=spot, env=self._rest_env(spot, nodes, idle_exit),
                                        nodes=nodes)
        else:
            job_id = self.driver.submit(self.spec, script, spot=spot, nodes=nodes)
        if warm:
            (self.state_dir / self.spec.name).mkdir(parents=True, exist_ok=True)
            (self.state_dir / self.spec.name / f"{job_id}.warm").touch()
        log.info("slurm.submitted", pool=self.spec.name, job_id=job_id, spot=spot, nodes=nodes, warm=warm)
        return job_id

    def _warm(self, job_id: str) -> bool:
        return (self.state_dir / self.spec.name / f"{job_id}.warm").exists()

    def _rest_env(self, spot: bool, nodes: int, idle_exit_s: float) -> dict[str, str]:
        """What sbatch would have exported for the agent: PATH, the storage settings, the agent's own."""
        source = self.env if self.env is not None else os.environ
        env = {"PATH": source.get("PATH", "/usr/local/bin:/usr/bin:/bin")}
        env.update({k: v for k, v in source.items() if k == names.CONNECTION
                    or k.startswith(f"{names.CONNECTION}__") or k in _PASSED_TO_REST_JOBS})
        env.update(build.agent_env(self.spec, idle_exit_s=idle_exit_s, state_dir=str(self.state_dir), spot=spot,
                                   nodes=nodes))
        return env

    def close(self) -> None:
        """Nothing to release: the agents belong to Slurm and leave when idle (``idle_exit_s``)."""


_ALIVE = (NodeState.PENDING, NodeState.IDLE, NodeState.RUNNING)
# What a REST submission passes on from the scaler's environment (sbatch would export everything).
_PASSED_TO_REST_JOBS = ("SLURM_CONF", "AZURE_CLIENT_ID", "OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")
# Pending reasons that are the normal wait; any other (a limit, a down partition) is told to the jobs.
_ROUTINE = frozenset({"", "Priority", "Resources", "None", "BeginTime", "Dependency", "Cleaning"})
