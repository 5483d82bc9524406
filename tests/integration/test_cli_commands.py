"""Issue 25 items 9, 12 and 13 through the real ``upwell`` command, against the session's Azurite, found
from a stack state file (no ``AzureWebJobsStorage``, as a user's second terminal has none):

- ``--version``, shell completion (typer's script, and a real completion answered by the command), and
  ``logs JOB --follow`` printing each attempt's log as it lands until the job ends;
- every listing command (each one with ``--json``) fits 80 columns, cuts nothing, and its ``--json`` parses;
- a rejected CSV's ``.error.json`` lists every bad row (up to the limit); ``quarantine list|show|retry``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.pipeline_helpers import module_azurite
from upwell import __version__, names
from upwell.cli import app
from upwell.ingest.ingestor import Ingestor
from upwell.ingest.quarantine import ERROR_SUFFIX
from upwell.ledger import JobRow, JobState, Ledger
from upwell.local.stack import save_state
from upwell.settings import Settings
from upwell.storage import Storage

ROOT = Path(__file__).resolve().parents[2]
RULE = b"""name: gauge
match: "instruments/gauge/*.csv"
columns: {time: float, level: float}
shard: {rows: 100}
payload: channel-stats
"""
BAD = b"time,level\n0,1.0\nx,2.0\n2,3.0\n3,oops\n4,5.0,9\n5,6.0\n"  # rows 3, 5 and 6 are bad
LONG = "a budget shortfall: this job's estimate is over what is left of the project's budget for the window"


# Its own Azurite: the listings show every job and rule there, and on the session's one what the modules before it
# left (on the same pytest worker) would be in the 80-column tables it checks.
azurite = module_azurite("cli-commands")


@pytest.fixture(scope="module")
def home(azurite, tmp_path_factory) -> Path:
    """A stack state file naming the module's Azurite, as `upwell up` writes it; its storage, seeded."""
    where = tmp_path_factory.mktemp("home")
    store = Storage(azurite.connection_string)
    store.ensure()
    save_state(where, "ready", azurite.ports, 7999)
    ledger = Ledger(store)
    ledger.create_job(JobRow(job_id="listed-000000000001", name="a long message", status=JobState.REJECTED,
                             payload="logistic", pool="cpu", message=LONG))
    return where


def upwell(home: Path, *args: str, env: dict[str, str] | None = None, code: int = 0) -> str:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("UPWELL_", names.CONNECTION))}
    base.update(PYTHONPATH=str(ROOT), UPWELL_HOME=str(home), UPWELL_RUN_DIR=str(home / "run"), COLUMNS="80")
    done = subprocess.run([str(ROOT / ".venv" / "bin" / "upwell"), *args], cwd=home, env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == code, f"upwell {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done.stdout


def test_version_and_shell_completion(home):
    assert upwell(home, "--version").strip() == f"upwell {__version__}"
    script = upwell(home, "--show-completion", "bash")
    assert "_UPWELL_COMPLETE=complete_bash" in script and "complete -o default -F" in script, script
    # What the installed script asks the command when a user presses TAB after `upwell quar`.
    said = upwell(home, env={"_UPWELL_COMPLETE": "complete_bash", "COMP_WORDS": "upwell quar", "COMP_CWORD": "1"})
    assert said.split() == ["quarantine"], said


def inproc(monkeypatch, azurite, *args: str) -> str:
    """The same command in this process (typer's runner): for the checks that need no console script."""
    monkeypatch.setenv(names.CONNECTION, azurite.connection_string)  # restored after the test
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, (args, result.output, result.exception)
    return result.stdout


# Every listing command upwell registers (the test below fails on one it does not know), with what its
# --json must parse to. `quarantine show` takes the path the quarantine test module seeds below.
LISTINGS = {("status",): list, ("status", "listed-000000000001"): dict, ("cost",): dict, ("janitor",): list,
            ("prices", "show"): dict, ("payload", "list"): list, ("quarantine", "list"): list,
            ("quarantine", "show", "instruments/gauge/wide.csv"): dict, ("reconcile", "--dry-run"): dict,
            ("settings",): list, ("access", "list"): list}


def _listing_commands() -> set[str]:
    """The name of every registered command that has a --json option: the listings."""
    import typer

    def walk(cmd, path):
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from walk(sub, (*path, name))
        if any("--json" in p.opts for p in getattr(cmd, "params", ())):
            yield " ".join(path)

    return set(walk(typer.main.get_command(app), ()))


def test_every_listing_fits_80_columns_cuts_nothing_and_has_json_that_parses(home, azurite, monkeypatch, tmp_path):
    store = Storage(azurite.connection_string)
    store.put(f"{names.PIPELINES}/gauge.yaml", RULE)
    store.put(f"{names.INCOMING}/instruments/gauge/wide.csv", BAD)
    assert Ingestor(store, Settings()).ingest("instruments/gauge/wide.csv").status == "rejected"
    monkeypatch.setenv("UPWELL_ACCESS_FILE", str(tmp_path / "access.json"))
    inproc(monkeypatch, azurite, "access", "grant", "0f4c8a2e-5b1d-4e7a-9c3f-2d6b8e1a7f90", "--project",
           "a-project-with-a-long-name", "--role", "submitter")
    assert {" ".join(a for a in args if not a.startswith(("-", "listed", "instruments"))) for args in LISTINGS} \
        == _listing_commands()
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich, as on a terminal 80 wide (a pipe gets whole lines)
    for args, kind in LISTINGS.items():
        out = re.sub(r"\x1b\[[0-9;]*m", "", inproc(monkeypatch, azurite, *args))
        lines = out.splitlines()
        assert lines and max(len(ln) for ln in lines) <= 80, (args, [ln for ln in lines if len(ln) > 80])
        assert "…" not in out, (args, [ln for ln in lines if "…" in ln])
        parsed = json.loads(inproc(monkeypatch, azurite, *args, "--json"))
        assert isinstance(parsed, kind), (args, parsed)
    # And through the console script, found from the state file, at 80 columns.
    assert any(j["job_id"] == "listed-000000000001" for j in json.loads(upwell(home, "status", "--json")))


def test_the_job_listing_fits_80_columns_and_cuts_nothing(home):
    out = upwell(home, "status", env={"TTY_COMPATIBLE": "1"})  # as on a terminal 80 wide
    lines = re.sub(r"\x1b\[[0-9;]*m", "", out).splitlines()
    assert lines and max(len(ln) for ln in lines) <= 80, "\n".join(ln for ln in lines if len(ln) > 80)
    assert "…" not in out and re.search(r"^listed-000000000001 +rejected +logistic +cpu +0/0/0 ", "\n".join(lines),
                                        flags=re.M), lines
    assert LONG in " ".join(ln.strip() for ln in lines), lines  # the whole message, word-wrapped, not cut


def test_logs_follow_prints_each_attempt_as_it_lands_until_the_job_ends(home, azurite):
    store = Storage(azurite.connection_string)
    ledger = Ledger(store)
    job = "follow-000000000001"
    ledger.create_job(JobRow(job_id=job, status=JobState.RUNNING, payload="logistic", pool="cpu"))
    store.put(f"{names.RESULTS}/{job}/s00000/payload.log", b"first attempt of s00000\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("UPWELL_", names.CONNECTION))}
    proc = subprocess.Popen([str(ROOT / ".venv" / "bin" / "upwell"), "logs", job, "--follow", "--interval", "0.2"],
                            cwd=home, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**base, "PYTHONPATH": str(ROOT), "UPWELL_HOME": str(home)})
    try:
        seen = [proc.stdout.readline(), proc.stdout.readline()]  # it printed the log there was, and follows
        assert seen == ["== s00000 ==\n", "first attempt of s00000\n"], seen
        store.put(f"{names.RESULTS}/{job}/s00000/payload.log", b"second attempt of s00000\n")
        store.put(f"{names.RESULTS}/{job}/s00001/payload.log", b"only attempt of s00001\n")
        store.put(f"{names.RESULTS}/{job}/s00001.json", b"{}")
        store.put(f"{names.RESULTS}/{job}/s00002.json", b"{}")  # ended, printed nothing: no log kept
        ledger.update_job(job, status=JobState.SUCCEEDED)
        rest, _ = proc.communicate(timeout=60)  # the job ended: it prints what landed, then exits
    finally:
        proc.kill()
    assert proc.returncode == 0, rest
    assert rest == ("== s00000 ==\nsecond attempt of s00000\n== s00001 ==\nonly attempt of s00001\n"
                    "== s00002 ==\n(no output)\n"), rest
    assert upwell(home, "logs", job, "--shard", "s00001") == "only attempt of s00001\n"  # one shard: as it is
    assert upwell(home, "logs", job, "s00002") == ""  # its log is empty; "(no output)" went to stderr
    assert upwell(home, "logs", job, "s0000", code=1) == ""  # no such shard: a prefix of two is neither


def test_quarantine_lists_every_bad_row_and_retry_ingests_the_fixed_file(home, azurite, tmp_path, monkeypatch):
    store = Storage(azurite.connection_string)
    store.put(f"{names.PIPELINES}/gauge.yaml", RULE)
    name = "instruments/gauge/day1.csv"
    store.put(f"{names.INCOMING}/{name}", BAD)
    assert Ingestor(store, Settings()).ingest(name).status == "rejected"
    error = json.loads(store.read(f"{names.QUARANTINE}/{name}{ERROR_SUFFIX}"))
    assert [(r["row"], r["field"]) for r in error["rows"]] == [(3, "time"), (5, "level"), (6, "row")], error
    assert error["row"] == 3 and error["more_rows"] is False and error["incoming"] == name

    listed = json.loads(upwell(home, "quarantine", "list", "--json"))
    assert [len(e["rows"]) for e in listed if e["path"] == name] == [3], listed
    shown = upwell(home, "quarantine", "show", f"quarantine/{name}", env={"COLUMNS": "200"})
    assert "3 bad row(s)" in shown and "'oops' is not float" in shown and "has 3 fields" in shown, shown
    assert json.loads(inproc(monkeypatch, azurite, "quarantine", "show", name, "--json"))["rows"] == error["rows"]
    missing = CliRunner().invoke(app, ["quarantine", "show", "instruments/gauge/none.csv"])
    assert missing.exit_code == 1 and "no error file" in missing.output, missing.output

    fixed = tmp_path / "day1.csv"
    fixed.write_bytes(b"time,level\n0,1.0\n1,2.0\n2,3.0\n3,4.0\n4,5.0\n5,6.0\n")
    said = upwell(home, "quarantine", "retry", name, "--file", str(fixed))
    job = re.search(r"\(job (\S+)\)", said)[1]
    assert not store.exists(f"{names.QUARANTINE}/{name}") and not store.exists(f"{names.QUARANTINE}/{name}"
                                                                                 f"{ERROR_SUFFIX}")
    assert store.read(f"{names.INCOMING}/{name}") == fixed.read_bytes()
    assert Ingestor(store, Settings()).ingest(name).job_id == job  # what the blob event starts on the stack
    assert Ledger(store).job(job).status == JobState.ACCEPTED


def test_the_bad_rows_stop_at_the_limit(home, azurite, monkeypatch):
    store = Storage(azurite.connection_string)
    store.put(f"{names.PIPELINES}/gauge.yaml", RULE)
    name = "instruments/gauge/many.csv"
    store.put(f"{names.INCOMING}/{name}", b"time,level\n" + b"".join(b"x,%d\n" % i for i in range(50)))
    monkeypatch.setenv("UPWELL_QUARANTINE_MAX_ROWS", "7")
    assert Ingestor(store, Settings.from_env()).ingest(name).status == "rejected"
    error = json.loads(store.read(f"{names.QUARANTINE}/{name}{ERROR_SUFFIX}"))
    assert [r["row"] for r in error["rows"]] == list(range(2, 9)) and error["more_rows"] is True
