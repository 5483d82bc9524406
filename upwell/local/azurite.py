"""Start and stop Azurite, the local Azure Storage emulator, from Python.

``Azurite`` runs the ``azurite`` binary that ``make install`` put under
``node_modules/.bin`` at the repository root, persists its data under
``location``, and waits until the blob, queue and table ports accept connections.
It owns the child process and nothing else: ``stop()`` terminates it, then kills
it if it does not leave in time.

The account is the emulator's well-known development account
(``devstoreaccount1``); its key is public and only ever valid against Azurite.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

from upwell import REPO

REPO = REPO
ACCOUNT = "devstoreaccount1"
# The emulator's published development key; it grants nothing outside Azurite.
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
DEFAULT_PORTS = (10000, 10001, 10002)
HOST = "127.0.0.1"


class AzuriteError(RuntimeError):
    """Azurite is missing, failed to start, or did not open its ports in time."""


class AzuriteNotInstalled(AzuriteError):
    """``node_modules/.bin/azurite`` is absent: ``make install`` has not run."""


def connection_string(blob_port: int = 10000, queue_port: int = 10001, table_port: int = 10002,
                      host: str = HOST) -> str:
    """The development-account connection string with explicit endpoints."""
    return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
            f"BlobEndpoint=http://{host}:{blob_port}/{ACCOUNT};"
            f"QueueEndpoint=http://{host}:{queue_port}/{ACCOUNT};"
            f"TableEndpoint=http://{host}:{table_port}/{ACCOUNT};")


def free_ports(count: int = 3, host: str = HOST) -> list[int]:
    """``count`` distinct TCP ports that were free a moment ago on ``host``.

    The sockets are bound together before any is closed, so the ports differ;
    another process may still take one before Azurite binds it (a small race
    that a retry of the whole start covers).
    """
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def port_open(port: int, host: str = HOST, timeout: float = 0.2) -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=timeout):
        return True
    return False


def is_running(ports: Iterable[int] = DEFAULT_PORTS, host: str = HOST) -> bool:
    """True when all of ``ports`` accept connections (an Azurite already up there)."""
    return all(port_open(p, host) for p in ports)


def find_binary(repo: Path = REPO) -> Path:
    """The repository's ``node_modules/.bin/azurite``; a clear error if it is not installed."""
    binary = repo / "node_modules" / ".bin" / "azurite"
    if not binary.exists():
        raise AzuriteNotInstalled(f"Azurite is not installed at {binary}; run `make install` "
                           "(it runs `npm ci` for package.json) at the repository root")
    return binary


class Azurite:
    """One Azurite child process serving blob, queue and table on 127.0.0.1.

    State: the ``Popen`` handle (None until ``start()``, again after ``stop()``),
    the three ports, the data folder, and the log file that keeps Azurite's
    stdout and stderr for the error message when it fails.
    """

    def __init__(self, location: Path, blob_port: int = 10000, queue_port: int = 10001,
                 table_port: int = 10002, *, startup_timeout: float = 30.0,
                 in_memory: bool = False, binary: Path | None = None,
                 extra_args: Iterable[str] = ()) -> None:
        self.location = Path(location)
        self.blob_port, self.queue_port, self.table_port = blob_port, queue_port, table_port
        self.startup_timeout = startup_timeout
        self.in_memory = in_memory
        self.binary = binary
        self.extra_args = tuple(extra_args)
        self.process: subprocess.Popen | None = None
        self.log_path = self.location / "azurite.log"

    @property
    def ports(self) -> tuple[int, int, int]:
        return (self.blob_port, self.queue_port, self.table_port)

    @property
    def connection_string(self) -> str:
        return connection_string(self.blob_port, self.queue_port, self.table_port)

    def command(self) -> list[str]:
        binary = self.binary or find_binary()
        # Azurite refuses --location together with --inMemoryPersistence; the log still goes to location.
        where = [] if self.in_memory else ["--location", str(self.location)]
        args = [str(binary), *where,
                "--blobHost", HOST, "--blobPort", str(self.blob_port),
                "--queueHost", HOST, "--queuePort", str(self.queue_port),
                "--tableHost", HOST, "--tablePort", str(self.table_port),
                "--skipApiVersionCheck", "--loose", "--silent", "--disableTelemetry"]
        if self.in_memory:
            args.append("--inMemoryPersistence")
        return args + list(self.extra_args)

    def start(self) -> Azurite:
        """Start Azurite and wait for its three ports; raise AzuriteError naming the cause."""
        if self.process is not None:
            return self
        busy = [p for p in self.ports if port_open(p)]
        if busy:
            raise AzuriteError(f"ports {busy} are already in use; is another Azurite running? "
                               "(upwell.local.azurite.is_running tells)")
        command = self.command()
        self.location.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            # A new session, so that a Ctrl-C meant for the caller reaches Azurite only via stop().
            self.process = subprocess.Popen(command, cwd=self.location, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                raise AzuriteError(f"Azurite exited with code {code} before opening its ports "
                                   f"{list(self.ports)}; its log says:\n{self._log_tail()}")
            if all(port_open(p) for p in self.ports):
                return
            time.sleep(0.05)
        raise AzuriteError(f"Azurite did not open ports {list(self.ports)} within {self.startup_timeout:g} s; "
                           f"its log says:\n{self._log_tail()}")

    def _log_tail(self, limit: int = 2000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-limit:] or "(empty)"
        return "(no log)"

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate Azurite, then kill it if it has not exited within ``timeout`` seconds."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def __enter__(self) -> Azurite:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid {self.process.pid}" if self.running else "stopped"
        return f"Azurite({str(self.location)!r}, ports={list(self.ports)}, {state})"


def start_on_free_ports(location: Path, attempts: int = 3, **kwargs) -> Azurite:
    """Start an Azurite on three free ports, retrying if another process takes one first."""
    error: AzuriteError | None = None
    for _ in range(attempts):
        blob, queue, table = free_ports(3)
        try:
            return Azurite(location, blob, queue, table, **kwargs).start()
        except AzuriteNotInstalled:
            raise
        except AzuriteError as exc:
            error = exc
    raise error

