"""Who runs the local stack on a set of ports: one small file per Azurite blob port.

`upwell up` and `upwell demo` write ``<run dir>/stack-<blob port>.json`` (the process id, the checkout, the
state folder, the ports) once their Azurite answers, and remove it when they stop. Another `up` or `demo`
reads it to say what it would reuse, and to refuse, or move to free ports, when that stack belongs to
another checkout. A file whose process has died is stale and ignored. The run dir is UPWELL_RUN_DIR, else
a folder in the system's temporary directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from pathlib import Path

from upwell import REPO


def run_dir() -> Path:
    return Path(os.environ.get("UPWELL_RUN_DIR") or Path(tempfile.gettempdir()) / "upwell-stacks")


def _path(blob_port: int) -> Path:
    return run_dir() / f"stack-{blob_port}.json"


def alive(pid: int) -> bool:
    """True while process ``pid`` runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def owner(blob_port: int) -> dict | None:
    """The live stack on ``blob_port``, or None (no file, unreadable, or its process is gone)."""
    try:
        info = json.loads(_path(blob_port).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and alive(int(info.get("pid") or 0)) else None


def claim(kind: str, home: Path, ports: tuple[int, int, int], http_port: int) -> None:
    path = _path(ports[0])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "kind": kind, "home": str(Path(home).resolve()),
                               "checkout": str(REPO), "ports": list(ports), "http_port": http_port,
                               "since": time.strftime("%Y-%m-%d %H:%M:%S")}))
    os.replace(tmp, path)


def release(blob_port: int) -> None:
    """Remove the file if this process wrote it."""
    info = None
    with contextlib.suppress(OSError, ValueError):
        info = json.loads(_path(blob_port).read_text())
    if isinstance(info, dict) and info.get("pid") == os.getpid():
        _path(blob_port).unlink(missing_ok=True)


def describe(info: dict) -> str:
    ports = "/".join(str(p) for p in info.get("ports", []))
    return (f"`upwell {info.get('kind', 'up')}` (pid {info.get('pid')}, since {info.get('since')}) of the checkout "
            f"{info.get('checkout')}, state in {info.get('home')}: Azurite on 127.0.0.1:{ports}, functions on "
            f"http://127.0.0.1:{info.get('http_port')}")


def same_home(info: dict, home: Path) -> bool:
    return info.get("home") == str(Path(home).resolve())


def live_stacks() -> list[dict]:
    """Every live stack recorded in the run dir, newest first (a file whose process is gone is skipped)."""
    found = []
    for path in sorted(run_dir().glob("stack-*.json")):
        with contextlib.suppress(ValueError):
            info = owner(int(path.stem.removeprefix("stack-")))
            if info:
                found.append(info)
    return sorted(found, key=lambda i: str(i.get("since")), reverse=True)
