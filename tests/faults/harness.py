"""The fault suite's harness: one fresh Azurite, the devhost on the real function_app, local agents.

Each fault test runs a job of tiny logistic shards (40 or 100) through the real
pipeline while it injects its fault, then ``verify`` checks that nothing was
lost: every shard is done exactly once in the ledger (or poisoned with its
error), each result exists once, the report was built once and lists the
failures, the queues drained, and no agent or payload process is left behind.
``TABLE`` collects one row per fault for the session summary (conftest.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml
from azure.core.exceptions import ResourceNotFoundError

from tests.pipeline_helpers import live_worker_pids, wait_for
from upwell import names
from upwell.ingest.blobnames import job_id_for
from upwell.ledger import JobRow, Ledger
from upwell.local.azurite import Azurite, free_ports
from upwell.messages import decode
from upwell.storage import Storage

REPO = Path(__file__).resolve().parents[2]
TABLE: list[dict] = []  # one row per fault, printed by conftest.pytest_terminal_summary
WORKERS = 3  # agents on this 2-core machine: the payload launch is the bottleneck, not the CPU count


def r_values(n: int) -> list[float]:
    return [round(2.5 + 1.5 * i / max(n - 1, 1), 6) for i in range(n)]


def sweep(name: str, n: int = 100, *, grid: dict | None = None, **params) -> bytes:
    """A logistic sweep manifest of ``n`` tiny shards (or the given grid)."""
    base = {"steps": 10, "burn_in": 0, "sleep_s": 0}
    doc = {"name": f"faults: {name}", "payload": "logistic", "params": {**base, **params},
           "grid": grid or {"r": r_values(n)}, "estimate": {"node_seconds_per_shard": 1}}
    return yaml.safe_dump(doc).encode()


@dataclass
class Counts:
    """What one fault run did and found; ``lost`` must be 0."""

    fault: str
    shards: int = 0
    kills: int = 0
    duplicates: int = 0
    restarts: int = 0
    preemptions: int = 0
    retries: int = 0
    poisoned: int = 0
    lost: int = -1
    seconds: float = 0.0
    recovery_s: float | str = ""  # event-path faults: from the faults' end to the report


@dataclass
class Stack:
    """One fault test's world: its own Azurite, state and scratch folders, and the environment."""

    root: Path
    azurite: Azurite
    env: dict[str, str]

    @property
    def storage(self) -> Storage:
        return Storage(self.azurite.connection_string)

    @property
    def state_dir(self) -> Path:
        return self.root / "pools"

    @property
    def scratch(self) -> Path:
        return self.root / "scratch"


def pools(workers: int = WORKERS) -> str:
    spec = {"backend": "local", "max_nodes": workers, "scale_down_votes": 5, "cooldown_s": 30.0,
            "price_key": "Standard_D2s_v5"}
    return json.dumps({"cpu": spec, "mpi": {**spec, "max_nodes": 1}, "gpu": {**spec, "max_nodes": 1}})


def start_azurite(root: Path, ports: tuple[int, int, int] | None = None) -> Azurite:
    for _ in range(3):
        blob, queue, table = ports or free_ports(3)
        try:
            return Azurite(root / "azurite", blob, queue, table).start()
        except Exception:  # a port taken between the probe and the bind: try others
            if ports:
                raise
    raise RuntimeError("Azurite did not start on free ports")


@contextmanager
def module_stack(root: Path, **extra_env: str):
    """A fresh Azurite under ``root`` for a module of tests, the pipeline's environment set for as long
    (``extra_env`` on top), its containers and tables made; workers closed and Azurite stopped after."""
    import pytest

    from upwell.local.azurite import AzuriteError
    try:
        emulator = start_azurite(root)
    except (AzuriteError, RuntimeError) as exc:
        pytest.fail(f"Azurite could not start (make setup installs it from npm): {exc}", pytrace=False)
    env = environment(root, emulator.connection_string, **extra_env)
    stack = Stack(root, emulator, env)
    patch = pytest.MonkeyPatch()
    apply_env(patch, env)
    stack.storage.ensure()
    try:
        yield stack
    finally:
        close_workers(stack)
        patch.undo()
        emulator.stop()


def environment(stack_root: Path, connection: str, **extra: str) -> dict[str, str]:
    return {names.CONNECTION: connection, "UPWELL_STATE_DIR": str(stack_root / "pools"),
            "UPWELL_SCRATCH": str(stack_root / "scratch"), "UPWELL_POOLS": pools(),
            "UPWELL_SCALE_SCHEDULE": "*/2 * * * * *",
            "UPWELL_RECONCILE_SCHEDULE": "*/5 * * * * *", "UPWELL_RECONCILE_GRACE_S": "4",
            "UPWELL_IDLE_EXIT_S": "30", "UPWELL_LEASE_S": "6",
            # an idle agent asks its queue every 0.25 s, as under `upwell up` (1 s on Azure): a message that
            # comes back (a lapsed lease, a retry's backoff) is taken sooner; nothing else changes
            "UPWELL_POLL_S": "0.25",
            "AzureFunctionsWebHost__hostid": "faults", **extra}


def apply_env(monkeypatch, env: dict[str, str]) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    import handlers.context
    import handlers.scale

    handlers.context.reset()
    handlers.scale.autoscaler.cache_clear()


@contextmanager
def in_process_host(stack: Stack, **options):
    """The devhost in this process, driving function_app; on exit every local worker is closed.
    ``options`` go to DevHost (``event_faults``, ``functions``, ``host_json``)."""
    from upwell.local.devhost.host import DevHost

    options = {"host_json": REPO / "host.json", **options}
    host = DevHost("function_app:app", connection_string=stack.azurite.connection_string, poll_interval=0.3,
                   port=0, script_root=REPO, shutdown_grace=10, **options)
    host.start()
    try:
        yield host
    finally:
        host.stop()
        close_workers(stack)


class HostProcess:
    """``python -m upwell.local.devhost`` as a child process, so that it can be killed with SIGKILL.
    ``module``: a test's own entry point that sets a seam and then runs the devhost."""

    module = "upwell.local.devhost"

    def __init__(self, stack: Stack):
        self.stack = stack
        self.proc: subprocess.Popen | None = None
        self.log = stack.root / "devhost.log"

    def start(self) -> None:
        env = {**os.environ, **self.stack.env, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", self.module, "--app", "function_app:app", "--host-json",
                 str(REPO / "host.json"), "--port", "0", "--poll-interval", "0.3", "--shutdown-grace", "5"],
                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.proc = None


def close_workers(stack: Stack) -> None:
    from upwell.pools.process import LocalPool
    from upwell.settings import Settings

    for spec in Settings.from_env(stack.env).pools.values():
        LocalPool(spec, stack.state_dir).close(timeout=15)


def upload(storage: Storage, name: str, data: bytes) -> str:
    etag = storage.blob(names.INCOMING, name).upload_blob(data, overwrite=True)["etag"]
    return job_id_for(name, etag)


def wait_until(predicate, timeout: float, what: str, interval: float = 0.3):
    """wait_for (tests.pipeline_helpers), asking again when the predicate raises: storage may be down on
    purpose. A timeout names the last answer or error."""
    last: list = [None]

    def asking():
        try:
            last[0] = predicate()
        except Exception as exc:  # noqa: BLE001 - storage may be down on purpose; keep asking
            last[0] = exc
            return None
        return last[0]

    return wait_for(asking, timeout, f"{what} ({timeout:.0f} s)", on_timeout=lambda: f"last: {last[0]!r}",
                    poll_s=interval)


def progress(storage: Storage, job_id: str) -> int:
    """Shards counted on the job row so far."""
    job = Ledger(storage).job(job_id) or JobRow(job_id=job_id)
    return int(job.shards_done or 0) + int(job.shards_failed or 0)


def wait_progress(storage: Storage, job_id: str, shards: int, timeout: float = 120) -> None:
    wait_until(lambda: progress(storage, job_id) >= shards, timeout, f"{shards} shards of {job_id} counted")


def wait_reported(storage: Storage, job_id: str, timeout: float = 180) -> dict:
    def reported():
        job = Ledger(storage).job(job_id)
        return job if job and job.reported else None

    return wait_until(reported, timeout, f"the report of {job_id}")


def queue_count(storage: Storage, queue: str) -> int:
    try:
        return storage.queue(queue).get_queue_properties().approximate_message_count or 0
    except ResourceNotFoundError:
        return 0  # the devhost creates webjobs-blobtrigger-poison only when it first poisons a blob


def payload_pids(scratch: Path) -> list[int]:
    """Live payload processes whose work directory is under ``scratch``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().split(")")[-1].split()[0]
        except OSError:
            continue
        if "workers.payloads" in cmd and str(scratch) in cmd and state != "Z":
            found.append(int(proc.name))
    return found


def verify(stack: Stack, job_id: str, counts: Counts, *, poisoned: set[str] = frozenset(),
           drain_timeout: float = 60) -> Counts:
    """Everything the issue asks after a fault; fills ``counts`` (lost, poisoned, retries, preemptions)."""
    storage, ledger = stack.storage, Ledger(stack.storage)
    job = wait_reported(storage, job_id)
    rows = {r.shard_id: r for r in ledger.shards(job_id)}
    total = int(job.shards_total)
    assert total == counts.shards == len(rows), (total, counts.shards, len(rows))
    done = {s for s, r in rows.items() if r.status == "succeeded"}
    failed = {s for s, r in rows.items() if r.status == "failed" and r.error}
    counts.lost = total - len(done) - len(failed)
    counts.poisoned = len(failed)
    counts.retries = sum(int(r.failures or 0) for r in rows.values())
    counts.preemptions = sum(int(r.preemptions or 0) for r in rows.values())
    assert counts.lost == 0, {s: r.status for s, r in rows.items() if s not in done | failed}
    assert failed == set(poisoned), (sorted(failed), sorted(poisoned))
    # Counted exactly once: the job row's counters agree with the shard rows.
    assert (int(job.shards_done), int(job.shards_failed)) == (len(done), len(failed))
    assert job.status == ("succeeded" if not failed else "partially_failed"), job.status
    # Each result exists exactly once, and says what the ledger says.
    result_names = sorted(b.name for b in storage.list(names.RESULTS, f"{job_id}/") if b.name.count("/") == 1)
    assert result_names == sorted(f"{job_id}/{s}.json" for s in rows), "one result per shard"
    for s in rows:
        doc = json.loads(storage.read(f"{names.RESULTS}/{job_id}/{s}.json"))
        assert doc["status"] == ("failed" if s in failed else "succeeded"), (s, doc["status"])
    # The report: built once, listing the failures.
    assert int(job.report_count or 0) == 1, job.report_count
    summary = json.loads(storage.read(f"{names.REPORTS}/{job_id}/summary.json"))
    assert {f["shard_id"] for f in summary["failures"]} == failed
    assert summary["counts"]["succeeded"] == len(done)
    # No message stays invisible forever: the work and report queues drain; poison holds the poisoned.
    work = names.work_queue("cpu")
    wait_until(lambda: queue_count(storage, work) == 0 and queue_count(storage, names.REPORT_QUEUE) == 0,
               drain_timeout, "the work and report queues to drain")
    poison = [decode(m.content) for m in storage.queue(names.poison_queue(work)).peek_messages(max_messages=32)]
    assert sorted(i.shard_id for i in poison if i.job_id == job_id) == sorted(failed)
    assert queue_count(storage, names.poison_queue(work)) == len(failed)
    assert queue_count(storage, names.BLOB_POISON_QUEUE) == 0, "a blob trigger gave up"
    return counts


def no_orphans(stack: Stack) -> None:
    """After the host and pool are closed: no live agent under the state dir, no payload process."""
    wait_until(lambda: not live_worker_pids(stack.state_dir), 20, "agents to exit")
    wait_until(lambda: not payload_pids(stack.scratch), 20, "payload processes to exit")


@contextmanager
def recorded(fault: str, **counts):
    """Yields the Counts of one fault run and adds them to TABLE however the run ends
    (lost stays -1 when the run failed before it could count)."""
    row, started = Counts(fault, **counts), time.monotonic()
    try:
        yield row
    finally:
        row.seconds = round(time.monotonic() - started, 1)
        TABLE.append(row.__dict__.copy())
