"""The embedded default: Azurite, the devhost and the local pool, as child processes.

``LocalStack`` owns those children. ``start()`` reuses an Azurite that already
listens on the chosen ports (a second ``upwell up`` keeps the data under
``.upwell/azurite``); ``stop()`` stops the devhost, drains the local workers and
stops the Azurite it started, and nothing else.

The stack's state file, ``<home>/stack.json`` (``save_state``/``load_state``/``clear_state``), tells every other
command where a running ``upwell up`` listens: its process, its phase (``starting``, then ``ready``), its ports and
its connection string. A command without ``AzureWebJobsStorage`` reads it (``upwell.local.reach``), so a stack on
moved ports is found; a file whose process is gone is stale and ignored.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from upwell import REPO, names
from upwell.local import azurite, owner
from upwell.settings import Settings

if TYPE_CHECKING:
    from upwell.storage import Storage

REPO = REPO
DEFAULT_SCHEDULE = "*/3 * * * * *"
RECONCILE_SCHEDULE = "0 */5 * * * *"  # as on Azure (bicep reconcileSchedule)


# Local nodes share this machine's cores, so a payload's ranks and threads that wait give their core back instead of
# spinning on it. A spinner holds a core that the rank or thread it waits for (or another local node) needs, and on
# a busy machine every exchange then waits out a scheduler time slice: beside one busy process, a two-rank heat-mpi
# run that takes 20 s alone ran past 300 s, and a train-torch run with two OpenMP threads took 217 s instead of 20
# (38 s with these). Open MPI yields by itself only when it sees more ranks than slots; a dedicated Azure node keeps
# the runtimes' busy waiting. A user's own value is kept.
SHARED_MACHINE_WAITS = {"OMPI_MCA_mpi_yield_when_idle": "1", "OMP_WAIT_POLICY": "PASSIVE"}


class LocalStack:
    """Children: ``self.azurite`` (if started here) and ``self.devhost``."""

    def __init__(self, root: Path | None = None, *, ports: tuple[int, int, int] = azurite.DEFAULT_PORTS,
                 http_port: int = 7071, env: dict[str, str] | None = None, quiet: bool = False):
        self.root = Path(root or Path.cwd() / ".upwell")
        self.ports = ports
        self.http_port = http_port
        self.quiet = quiet
        self.azurite: azurite.Azurite | None = None
        self.devhost: subprocess.Popen | None = None
        self.connection_string = azurite.connection_string(*ports)
        self.env = {**(os.environ if env is None else env), names.CONNECTION: self.connection_string,
                    "UPWELL_STATE_DIR": str(self.root / "pools")}
        self.env.setdefault("UPWELL_SCALE_SCHEDULE", DEFAULT_SCHEDULE)
        self.env.setdefault("UPWELL_RECONCILE_SCHEDULE", RECONCILE_SCHEDULE)
        self.env.setdefault("UPWELL_SCALE_ON_INGEST", "1")  # the devhost runs the scale timer beside ingest
        # Upload to running: an idle local worker asks its queue every 0.25 s, the devhost scans blobs every 0.3 s
        # (Azurite answers locally; on Azure the agent's default stays 1 s and blob events are pushed).
        self.env.setdefault("UPWELL_POLL_S", "0.25")
        self.env.setdefault("UPWELL_WARM_RUNNER", "1")  # Python payloads forked from a pre-imported parent
        # Every local node is a process on this one machine: the time a payload waits for a CPU that another
        # "node" holds is not node time (the agent reads this setting once at start-up, workers.agent_config, and
        # picks its node clock by it), so local costs are what the work costs.
        self.env.setdefault("UPWELL_SHARED_MACHINE", "1")
        for name, value in SHARED_MACHINE_WAITS.items():  # and their ranks and threads wait without spinning
            self.env.setdefault(name, value)
        self.blob_poll_s = self.env.get("UPWELL_BLOB_POLL_S", "0.3")
        if not quiet and sys.stderr.isatty():
            self.env.setdefault("UPWELL_LOG_FORMAT", "console")
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), self.env.get("PYTHONPATH", "")]))

    @property
    def storage(self) -> Storage:
        from upwell.storage import Storage  # the SDK clients load only when used: `upwell status` reads the state

        return Storage(self.connection_string)

    def start_storage(self) -> None:
        if azurite.is_running(self.ports):
            self.azurite = None
        else:
            self.azurite = azurite.Azurite(self.root / "azurite", *self.ports).start()
        self.storage.ensure()

    def start_devhost(self) -> None:
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        out = open(self.root / "logs" / "devhost.log", "ab") if self.quiet else None  # noqa: SIM115
        self.devhost = subprocess.Popen(
            [sys.executable, "-m", "upwell.local.devhost", "--app", "function_app:app", "--host-json",
             str(REPO / "host.json"), "--port", str(self.http_port), "--poll-interval", self.blob_poll_s],
            cwd=REPO, env=self.env, stdout=out, stderr=subprocess.STDOUT if out else None,
            stdin=subprocess.DEVNULL, start_new_session=True)
        if out:
            out.close()

    def wait_subscribed(self, timeout: float = 60.0) -> bool:
        """Wait until the devhost's event publisher has created its Event Grid subscriptions.

        An upload before that gets no event (as on Azure, where the reconciler then finds it), so
        ``up`` and ``demo`` say ready only after it. False when the devhost exited or time ran out."""
        import time

        from upwell.local.devhost.config import AppSettings
        from upwell.local.devhost.host import default_host_id

        host_id = default_host_id(AppSettings(self.env))
        wanted = {f"{host_id}/blob-{fn}.json" for fn in ("ingest", "collect")}
        container = self.storage.container(names.LOCAL_EVENTGRID_STATE)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.alive():
            try:
                if wanted <= {b.name for b in container.list_blobs(name_starts_with=f"{host_id}/")}:
                    return True
            except Exception:  # noqa: BLE001 - the container appears with the first subscription
                pass
            time.sleep(0.3)
        return False

    def start(self) -> LocalStack:
        self.start_storage()
        self.start_devhost()
        self.wait_subscribed()
        return self

    def stop_devhost(self, timeout: float = 20.0) -> None:
        proc, self.devhost = self.devhost, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def stop_workers(self) -> None:
        from upwell.pools.process import LocalPool

        settings = Settings.from_env(self.env)
        for spec in settings.pools.values():
            if spec.backend == "local":
                LocalPool(spec, self.root / "pools").close()

    def stop(self) -> None:
        self.stop_devhost()
        self.stop_workers()
        if self.azurite is not None:
            self.azurite.stop()
            self.azurite = None

    def alive(self) -> bool:
        return self.devhost is not None and self.devhost.poll() is None

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()



STATE_FILE = "stack.json"


@dataclass(frozen=True)
class StackState:
    """What ``upwell up`` writes to ``<home>/stack.json``: who runs the stack and where it listens."""

    pid: int
    phase: str  # "starting" (Azurite and the devhost on their way) or "ready"
    ports: tuple[int, int, int]
    http_port: int
    connection_string: str

    @property
    def alive(self) -> bool:
        return owner.alive(self.pid)


def save_state(home: Path, phase: str, ports: tuple[int, int, int], http_port: int) -> StackState:
    """Write (atomically) this process's stack state under ``home``; returns it."""
    state = StackState(os.getpid(), phase, tuple(ports), http_port, azurite.connection_string(*ports))
    path = Path(home) / STATE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({**asdict(state), "ports": list(state.ports)}, indent=2) + "\n")
    os.replace(tmp, path)
    return state


def load_state(home: Path) -> StackState | None:
    """The stack state under ``home`` if its process still runs; None when absent, unreadable or stale."""
    try:
        raw = json.loads((Path(home) / STATE_FILE).read_text())
        state = StackState(int(raw["pid"]), str(raw["phase"]), tuple(int(p) for p in raw["ports"]),
                           int(raw["http_port"]), str(raw["connection_string"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return state if len(state.ports) == 3 and state.alive else None


def clear_state(home: Path) -> None:
    """Remove the state file if this process wrote it (a second ``up`` that was refused leaves the first's)."""
    path = Path(home) / STATE_FILE
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        if int(json.loads(path.read_text())["pid"]) == os.getpid():
            path.unlink()
