"""A new user's walk-through, in the order the README tells it (issue 25's acceptance).

Every line of every ``<!-- example: local -->`` block of README.md runs, in order, from a fresh copy of the
checkout (``tests/e2e/test_readme.py``'s clone and ``Reader``: the README's own checks of each line), with the
checks a new user makes on the way, at the point where they would meet them:

- before ``upwell up``: a command fails at once, in one line, naming the storage that does not answer and
  ``upwell up`` (item 1);
- ``upwell up`` on moved ports prints its connection string and writes ``.upwell/stack.json``; every later
  command runs without ``AzureWebJobsStorage`` and finds the stack from that file (item 2);
- ``--version`` prints the version; ``delete --yes`` says what it removes (items 9, 10);
- after Ctrl-C the state file is gone, and a command says again that no stack runs.

One stack serves the whole walk, as it serves a reader: this test is the README's run, not a second one.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.test_readme import BLOCKS, ROOT, Reader, _as_az_would, _check, _code
from tests.pipeline_helpers import live_worker_pids, wait_for
from upwell import __version__, names
from upwell.ledger import Ledger
from upwell.local import azurite


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tracked files as they are in this checkout, plus what `make install` leaves (linked, and the kernel)."""
    dest = tmp_path_factory.mktemp("readme") / "upwell"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for rel in filter(None, tracked.decode().split("\0")):
        if (ROOT / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)
    for installed in (".venv", "node_modules"):
        (dest / installed).symlink_to((ROOT / installed).resolve())
    made = subprocess.run(["make", "-s", "kernels"], cwd=dest, capture_output=True, text=True)
    assert made.returncode == 0, made.stdout + made.stderr
    return dest


def _stack_down(reader: Reader) -> str:
    """A command as a new user runs it with no stack: one line, exit 1 (the stack's ports set, as a user who
    set AzureWebJobsStorage would have them, so that another stack on this machine is never the one found)."""
    done = subprocess.run(["bash", "-c", ".venv/bin/upwell status"], cwd=reader.clone, capture_output=True, text=True,
                          env={**reader.env, names.CONNECTION: reader.connection}, timeout=60)
    lines = (done.stdout + done.stderr).splitlines()
    assert done.returncode == 1 and len(lines) == 1, lines
    assert f"127.0.0.1:{reader.ports[0]}" in lines[0] and "`upwell up`" in lines[0], lines
    return lines[0]


def _after_up(reader: Reader) -> None:
    said = "".join(reader.up_output)
    assert "data in .upwell/azurite" in said and (reader.clone / ".upwell" / "azurite").is_dir(), said
    assert all(re.search(rf"^│? ?{p}\s", said, flags=re.M) for p in ("cpu", "mpi", "gpu")), said
    assert f'"{reader.connection}"' in said, said  # for Storage Explorer or az --connection-string
    state = (reader.clone / ".upwell" / "stack.json").read_text()
    assert f'"connection_string": "{reader.connection}"' in state and '"phase": "ready"' in state, state
    assert names.CONNECTION not in reader.env


def _check_walk(reader: Reader, line: str, stdout: str, stderr: str) -> None:
    """The README's own check of the line, and the walk-through's."""
    if re.match(r"^\.venv/bin/upwell --version$", line):
        assert stdout.strip() == f"upwell {__version__}", stdout
        return
    _check(reader, line, stdout, stderr)


@pytest.mark.timeout(600)  # about a minute on an idle machine; several on a shared, overloaded one
def test_a_new_user_walks_through_the_readme(clone: Path, tmp_path: Path):
    reader = Reader(clone, tmp_path)
    started = time.monotonic()
    ran = 0
    try:
        _stack_down(reader)
        for block in BLOCKS:
            if block.mark == "azure" and "az storage blob upload" in block.text:
                _as_az_would(reader, block)
            if block.mark != "local":
                continue
            for line in block.commands():
                if re.match(r"^\.venv/bin/upwell up\b", line):
                    reader.start_up(line)
                    _after_up(reader)
                else:
                    _check_walk(reader, line, *reader.run(line))
                ran += 1
        assert reader.up is not None, "no local block starts `upwell up`"
        az = wait_for(lambda: (row := Ledger(reader.storage).job(reader.az_job)) and row.reported and row, 120,
                      "the job of the az upload to be reported")  # done long before: it ran beside the payloads
        assert az.status.value == "succeeded", az
        said = reader.ctrl_c()
    finally:
        reader.leave_nothing()
    print(f"\n{ran} README lines in {time.monotonic() - started:.0f} s:\n"
          + "\n".join(f"{s:6.1f} s  {_code(line)}" for s, line in reader.timings))
    assert reader.up.returncode == 0 and "stopped" in said, said[-3000:]
    assert not azurite.is_running(tuple(reader.ports[:3])), "Azurite still listens after Ctrl-C"
    assert live_worker_pids(clone / ".upwell" / "pools") == [], "local workers outlived Ctrl-C"
    assert not (clone / ".upwell" / "stack.json").exists(), "the state file outlived its stack"
    _stack_down(reader)
    assert ran == sum(len(b.commands()) for b in BLOCKS if b.mark == "local")
