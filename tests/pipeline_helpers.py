"""Helpers for end-to-end tests: a devhost driving the real function_app against the test Azurite."""

from __future__ import annotations

import json
import os
import signal
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from upwell import names
from upwell.ledger import Ledger
from upwell.settings import Settings
from upwell.storage import Storage

REPO = Path(__file__).resolve().parent.parent

POOLS = {"cpu": {"backend": "local", "max_nodes": 2, "scale_down_votes": 1, "cooldown_s": 1.0,
                 "price_key": "Standard_D2s_v5"},
         "mpi": {"backend": "local", "max_nodes": 1, "scale_down_votes": 1, "cooldown_s": 1.0,
                 "price_key": "Standard_D4s_v5"},
         "gpu": {"backend": "local", "max_nodes": 1, "scale_down_votes": 1, "cooldown_s": 1.0,
                 "price_key": "Standard_NC6s_v3"}}


def azurite_in(folder: Path):
    """Start Azurite on free ports in ``folder`` and yield it, stopped afterwards; a start that fails
    fails the test with the reason (a missing service never skips)."""
    from upwell.local.azurite import AzuriteError, start_on_free_ports

    try:
        emulator = start_on_free_ports(folder)
    except AzuriteError as exc:
        pytest.fail(f"Azurite could not start: {exc}", pytrace=False)
    try:
        yield emulator
    finally:
        emulator.stop()


def module_azurite(label: str, *, name: str = "azurite"):
    """A module-scoped fixture ``name``: the module's own Azurite, for tests that list whole containers or
    read the whole ledger, where other tests' blobs and jobs on the session's Azurite would be in the way."""

    @pytest.fixture(scope="module", name=name)
    def fixture(tmp_path_factory):
        yield from azurite_in(tmp_path_factory.mktemp(f"azurite-{label}"))

    return fixture


def ingest_manifest(store: Storage, path: str, manifest: str) -> str:
    """Upload a manifest to incoming/ and ingest it in this process; returns the accepted job's id."""
    from upwell.ingest.ingestor import Ingestor

    store.blob(names.INCOMING, path).upload_blob(manifest.encode(), overwrite=True)
    out = Ingestor(store, Settings()).ingest(path)
    assert out.status == "accepted", out
    return out.job_id


def pipeline_env(monkeypatch, connection: str, state_dir: Path, **extra: str) -> dict[str, str]:
    env = {names.CONNECTION: connection, "UPWELL_STATE_DIR": str(state_dir), "UPWELL_POOLS": json.dumps(POOLS),
           "UPWELL_SCALE_SCHEDULE": "*/1 * * * * *",
           "UPWELL_RECONCILE_SCHEDULE": "0 */5 * * * *", "UPWELL_IDLE_EXIT_S": "20", **extra}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    import handlers.context
    import handlers.scale

    handlers.context.reset()
    handlers.scale.autoscaler.cache_clear()
    return env


@contextmanager
def running_host(connection: str, state_dir: Path):
    """A DevHost on the real function_app; on exit it stops and every local worker is closed."""
    from upwell.local.devhost.host import DevHost
    from upwell.pools.process import LocalPool

    host = DevHost("function_app:app", connection_string=connection, host_json=REPO / "host.json",
                   poll_interval=0.3, port=0, script_root=REPO, shutdown_grace=10)
    host.start()
    try:
        yield host
    finally:
        host.stop()
        for spec in Settings.from_env().pools.values():
            LocalPool(spec, state_dir).close(timeout=10)


def wait_for(predicate, timeout: float, what: str, on_timeout=lambda: "", poll_s: float = 0.2):
    """Poll ``predicate`` until it returns something truthy (returned), or fail naming ``what`` and,
    where given, what ``on_timeout()`` says about the state at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    detail = on_timeout()
    raise AssertionError(f"timed out waiting for {what}" + (f"; {detail}" if detail else ""))


def wait_reported(storage: Storage, job_id: str, timeout: float = 120.0) -> dict:
    ledger = Ledger(storage)
    deadline = time.monotonic() + timeout
    job = None
    while time.monotonic() < deadline:
        job = ledger.job(job_id)
        if job and (job.reported or job.status == "rejected"):
            return job
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} not reported in {timeout}s; last row: {job}; "
                         f"shards: {[(s.shard_id, s.status) for s in ledger.shards(job_id)]}")


def live_worker_pids(state_dir: Path) -> list[int]:
    """The pool's workers that are alive now. A pid file can vanish between the listing and its read (the pool
    removes an exited worker's files) or be read before its write is whole: either is a worker not counted."""
    pids = []
    for pidfile in state_dir.glob("*/*.pid"):
        try:
            pid = int(pidfile.read_text())
        except (FileNotFoundError, ValueError):
            continue
        try:
            os.kill(pid, 0)
            stat = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
            if stat != "Z":
                pids.append(pid)
        except (ProcessLookupError, FileNotFoundError):
            continue
    return pids


def kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
