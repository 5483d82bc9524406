"""`upwell up` as a user runs it: a third-party upload produces a report; Ctrl-C stops every child;
a second `up` reuses the persisted data."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.pipeline_helpers import POOLS, live_worker_pids, wait_reported
from tests.thirdparty_put import put_blob
from upwell.ingest.blobnames import job_id_for
from upwell.ledger import Ledger
from upwell.local import azurite
from upwell.storage import Storage

REPO = Path(__file__).resolve().parents[2]
MANIFEST = b"payload: logistic\nparams: {steps: 300, burn_in: 50}\ngrid: {r: [3.2, 3.6]}\n"


def _up(home: Path, ports: list[int], *extra: str, run_dir: Path | None = None) -> subprocess.Popen:
    env = {**os.environ, "UPWELL_HOME": str(home), "UPWELL_POOLS": json.dumps(POOLS),
           "UPWELL_SCALE_SCHEDULE": "*/1 * * * * *", "UPWELL_STATE_DIR": str(home / "pools"),
           "UPWELL_RUN_DIR": str(run_dir or home.parent / "run"), "COLUMNS": "200"}
    env.pop("AzureWebJobsStorage", None)
    args = [sys.executable, "-m", "upwell.cli", "up", "--http-port", "0", "--blob-port", str(ports[0]),
            "--queue-port", str(ports[1]), "--table-port", str(ports[2]), *extra]
    return subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)


def _wait_ready(proc: subprocess.Popen, timeout: float = 60) -> str:
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        out += line
        if b"ready" in line:
            return out.decode()
        if proc.poll() is not None:
            break
    raise AssertionError(f"upwell up did not get ready: {out.decode()[-2000:]}")


def _stop(proc: subprocess.Popen, signum: int = signal.SIGINT) -> str:
    proc.send_signal(signum)
    try:
        rest, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        _kill_leftovers(proc)
        raise
    return rest.decode()


def _kill_leftovers(proc: subprocess.Popen) -> None:
    """After a failed stop, leave nothing running for the next test: `up`, and the children that it started
    in their own sessions (they still hold its stdout)."""
    proc.kill()
    target = os.readlink(f"/proc/{os.getpid()}/fd/{proc.stdout.fileno()}")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") == target for fd in os.listdir(f"/proc/{pid}/fd")) \
                    and int(pid) != os.getpid():
                os.kill(int(pid), signal.SIGKILL)
        except OSError:
            continue


def test_third_party_upload_while_up_runs(tmp_path):
    ports = azurite.free_ports(3)
    home = tmp_path / "home"
    proc = _up(home, ports)
    try:
        _wait_ready(proc)
        assert put_blob(ports[0], "incoming", "thirdparty/job.yaml", MANIFEST) == 201
        store = Storage(azurite.connection_string(*ports))
        etag = store.blob("incoming", "thirdparty/job.yaml").get_blob_properties().etag
        job_id = job_id_for("thirdparty/job.yaml", etag)
        job = wait_reported(store, job_id, 120)
        assert job.status == "succeeded" and store.exists(f"reports/{job_id}/index.html")
    finally:
        tail = _stop(proc)
    assert proc.returncode == 0, tail
    assert "stopped" in tail
    assert not azurite.is_running(ports), "Azurite still listening after Ctrl-C"
    assert live_worker_pids(home / "pools") == []

    # A second `up` reuses the data persisted under the home folder.
    proc = _up(home, ports)
    try:
        _wait_ready(proc)
        assert Ledger(Storage(azurite.connection_string(*ports))).job(job_id).status == "succeeded"
    finally:
        _stop(proc)


def _started_by_up(home: Path) -> dict[int, str]:
    """Live processes (not zombies) that carry this `up`'s UPWELL_HOME in their environment: `up` itself and
    every child it started, each in its own session (so no process group finds them all), as pid: cmdline."""
    mark = f"UPWELL_HOME={home}".encode()
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if mark not in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                continue
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            found[int(pid)] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # exited meanwhile
            continue
    return found


def test_closing_the_terminal_stops_every_child(tmp_path):
    """SIGHUP (the terminal closed) stops the devhost and Azurite as Ctrl-C does: no orphans."""
    ports = azurite.free_ports(3)
    home = tmp_path / "home"
    proc = _up(home, ports)
    _wait_ready(proc)
    assert azurite.is_running(ports)
    running = _started_by_up(home).values()  # the probe finds the children while they run
    assert any("upwell.local.devhost" in c for c in running) and any(str(ports[0]) in c for c in running), running
    out = _stop(proc, signal.SIGHUP)
    assert proc.returncode == 0, out[-2000:]
    assert not azurite.is_running(ports)
    assert _started_by_up(home) == {}


def test_a_second_up_and_another_checkout_are_told_what_runs(tmp_path):
    """Two checkouts never share a stack silently: a second `up` of the same checkout says what runs and exits 1;
    another checkout is refused on the same ports, or moves to free ports with --free-ports. `--workers` shows in
    the pool table printed at start."""
    ports = azurite.free_ports(3)
    first = _up(tmp_path / "a" / ".upwell", ports, "--workers", "cpu=1")
    try:
        out = _wait_ready(first)
        assert re.search(r"cpu\s.*local\s.*0-1\s", out), out
        again = subprocess.run(_args(first), cwd=REPO, env=_env(first), capture_output=True, text=True, timeout=60)
        assert again.returncode == 1 and "already runs here" in again.stdout and str(first.pid) in again.stdout, \
            again.stdout
        other = _up(tmp_path / "b" / ".upwell", ports, run_dir=tmp_path / "a" / "run")
        rest = other.communicate(timeout=60)[0].decode()
        assert other.returncode == 1 and "another checkout" in rest and "--free-ports" in rest, rest
        moved = _up(tmp_path / "b" / ".upwell", ports, "--free-ports", run_dir=tmp_path / "a" / "run")
        try:
            said = _wait_ready(moved)
            assert "uses free ports" in said and str(tmp_path / "a") in said, said
        finally:
            assert "stopped" in _stop(moved)
        assert azurite.is_running(ports), "the other checkout's Azurite must stay up"
    finally:
        _stop(first)
    assert first.returncode == 0


def _args(proc: subprocess.Popen) -> list[str]:
    return Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def _env(proc: subprocess.Popen) -> dict[str, str]:
    raw = Path(f"/proc/{proc.pid}/environ").read_bytes().decode(errors="replace").split("\0")
    return dict(item.split("=", 1) for item in raw if "=" in item)
