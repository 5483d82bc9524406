"""Whose local stack holds the ports: the owner file that `up` and `demo` write, and the demo's choice to run
its own stack on free ports (and say whose stack holds the defaults) instead of attaching to it."""

from __future__ import annotations

import io
import os
import subprocess
import sys

from rich.console import Console

from upwell.local import demo, owner


def test_the_owner_file_names_a_live_stack_and_ignores_a_dead_one(tmp_path, monkeypatch):
    monkeypatch.setenv("UPWELL_RUN_DIR", str(tmp_path / "run"))
    assert owner.owner(12345) is None
    owner.claim("up", tmp_path / "home", (12345, 12346, 12347), 7071)
    info = owner.owner(12345)
    assert info["pid"] == os.getpid() and owner.same_home(info, tmp_path / "home")
    assert "12345/12346/12347" in owner.describe(info) and str(tmp_path / "home") in owner.describe(info)
    owner.release(12345)
    assert owner.owner(12345) is None
    # A file left by a process that has gone is stale.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    owner.claim("up", tmp_path / "home", (12345, 12346, 12347), 7071)
    path = tmp_path / "run" / "stack-12345.json"
    path.write_text(path.read_text().replace(f'"pid": {os.getpid()}', f'"pid": {dead.stdout.strip()}'))
    assert owner.owner(12345) is None


def test_demo_runs_its_own_stack_when_the_default_ports_are_taken(azurite, tmp_path, monkeypatch):
    monkeypatch.setenv("UPWELL_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setattr("upwell.local.azurite.DEFAULT_PORTS", azurite.ports)
    owner.claim("up", tmp_path / "other-checkout" / ".upwell", azurite.ports, 7071)
    out = io.StringIO()
    stack = demo._own_stack(tmp_path / ".upwell", Console(file=out, width=300))
    said = out.getvalue()
    assert "the default ports are in use by `upwell up`" in said and "other-checkout" in said, said
    assert set(stack.ports).isdisjoint(azurite.ports) and stack.root == tmp_path / ".upwell" / "demo"
    owner.release(azurite.ports[0])
