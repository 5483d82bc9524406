"""The README's command lines are real: every `upwell` line in its code blocks names the venv's script, is a
command that exists, and parses with the options it shows; the `az` upload does not reuse a path that the
`submit` line before it already took."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import typer

from upwell.cli import app

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _blocks(text: str) -> list[str]:
    blocks, current = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            if current is None:
                current = []
            else:
                blocks.append("\n".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


BLOCKS = _blocks(README)


def _lines(word: str) -> list[str]:
    return [ln.split("  #")[0].strip() for block in BLOCKS for ln in block.splitlines()
            if re.match(rf"^\s*(\S*/)?{word}\b", ln)]


def test_every_upwell_line_uses_the_venv_script_and_parses():
    lines = _lines("upwell")
    assert len(lines) >= 12, lines
    group = typer.main.get_command(app)
    for line in lines:
        assert line.startswith(".venv/bin/upwell "), f"bare upwell needs the venv activated: {line}"
        args = [a.replace("<job>", "job-id").strip("[]") for a in shlex.split(line)[1:]]
        args = [a for a in args if a]
        cmd, rest = group, args
        while getattr(cmd, "commands", None) is not None:  # a group: walk down to the command
            assert rest and rest[0] in cmd.commands, f"no such command in: {line}"
            cmd, rest = cmd.commands[rest[0]], rest[1:]
        cmd.make_context(cmd.name, rest)  # raises a UsageError for an unknown option or a missing argument


def test_the_az_example_uploads_to_a_path_of_its_own():
    submitted = {m for line in _lines("upwell") if " submit " in line and "--dry-run" not in line
                 for m in re.findall(r"--prefix (\S+)", line)}
    az = " ".join(b for b in BLOCKS if "az storage blob upload" in b)
    name = re.search(r"--name (\S+)", az)[1]
    for prefix in submitted:
        assert not name.startswith(f"{prefix}sweep/"), f"{name} is where `upwell submit` already put the sweep"


def test_license_and_contributing_exist():
    assert "MIT License" in (ROOT / "LICENSE").read_text()
    assert 'license = { text = "MIT" }' in (ROOT / "pyproject.toml").read_text()
    assert "make test-fast" in (ROOT / "CONTRIBUTING.md").read_text()
    assert re.search(r"^test-fast: .*iac-install", (ROOT / "Makefile").read_text(), flags=re.M)
