"""Fixtures of the fault suite, and the table of its counts at the end of the session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults import harness
from upwell.local.azurite import AzuriteError

COLUMNS = ("fault", "shards", "kills", "duplicates", "restarts", "preemptions", "retries", "poisoned", "lost",
           "seconds", "recovery_s")


@pytest.fixture
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[harness.Stack]:
    """A fresh Azurite (on disk, free ports) for one fault test, and the pipeline's environment set."""
    try:
        emulator = harness.start_azurite(tmp_path)
    except (AzuriteError, RuntimeError) as exc:
        pytest.fail(f"Azurite could not start: {exc}", pytrace=False)
    env = harness.environment(tmp_path, emulator.connection_string)
    harness.apply_env(monkeypatch, env)
    world = harness.Stack(tmp_path, emulator, env)
    world.storage.ensure()
    try:
        yield world
    finally:
        harness.close_workers(world)
        emulator.stop()


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not harness.TABLE:
        return
    tr = terminalreporter
    tr.section("fault suite: nothing lost")
    widths = {c: max(len(c), *(len(str(row.get(c, ""))) for row in harness.TABLE)) for c in COLUMNS}
    tr.write_line("  ".join(c.ljust(widths[c]) for c in COLUMNS))
    for row in harness.TABLE:
        tr.write_line("  ".join(str(row.get(c, "")).ljust(widths[c]) for c in COLUMNS))
    total = {c: sum(int(r.get(c) or 0) for r in harness.TABLE) for c in COLUMNS[1:-2]}
    seconds = sum(float(r.get("seconds") or 0) for r in harness.TABLE)
    tr.write_line("  ".join(["total".ljust(widths["fault"])] + [str(total[c]).ljust(widths[c])
                                                                for c in COLUMNS[1:-2]] + [f"{seconds:.0f}"]))
    lost = total["lost"]
    tr.write_line(f"lost = {lost}" + ("" if lost == 0 else "  <-- shards were lost"))
