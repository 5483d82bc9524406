"""The README's examples are real: its shell examples run in order, as written, on a fresh clone.

Every fenced block in README.md names its language (``sh``, ``yaml`` or ``text``), and every ``sh`` block is
preceded by a mark that says how it is checked:

- ``<!-- example: local -->``: runs on a developer machine. ``tests/e2e/test_walkthrough.py`` (a new user's
  walk-through, in the README's order, with the checks a new user makes on the way) copies the
  tracked files to a temporary folder (a fresh clone), links in what ``make install`` leaves there (``.venv``,
  ``node_modules``) and runs ``make kernels``, then runs every line of every local block through bash, in README
  order, from that folder. Each line must exit 0 and show what the README says it shows. ``upwell up`` holds its
  terminal, so it runs in the background until the last line and is then stopped with Ctrl-C (SIGINT to its
  process group), which must stop everything it started. What is substituted is only what a reader on a busy
  machine would: ``up`` gets free ports (``--blob-port`` ... ``--http-port``, as ``up`` itself suggests when the
  standard ones are taken), the other commands find it from its state file (``.upwell/stack.json``), with no
  ``AzureWebJobsStorage``; ``PATH`` and
  ``PYTHONPATH`` point into the copy. The commands other than ``up`` get ``OMP_NUM_THREADS=1``: on a shared,
  oversubscribed machine PyTorch's thread pool makes ``payload run train-torch`` five times slower, and no
  example's output depends on it.
- ``<!-- example: azure -->``: needs Azure or its tools (``az``, ``azd``, a deployed Function App, Storage
  Explorer), which this machine does not have. Such a block must parse (``bash -n``), every ``upwell`` command in
  it must exist (``--help`` succeeds) and parse, every ``az`` command and flag must be one we checked against the
  Azure CLI reference (``AZ_COMMANDS``), and every repository file it names must exist. The ``az storage blob
  upload`` example is also replayed, at its place in the order, with the Storage SDK (the same container, blob
  name and file), and the ``upwell status`` line the README gives after it must find the job.
- ``<!-- example: suite -->``: ``make demo`` and ``make test``. They are not run here: ``make test`` runs this
  very test (and every other suite), and ``make demo`` runs every sample end to end for many minutes (its parts
  are tested on their own: ``upwell up`` here and in ``tests/e2e/test_up.py``, the pipeline in
  ``tests/e2e/test_pipeline.py``, each payload in its own tests).
  This test checks that the targets exist in the Makefile.

An unmarked ``sh`` block, an unlabelled fence or an unknown mark fails ``test_every_block_is_labelled_and_marked``.
The ``yaml`` blocks must load as the manifest or pipeline rule they show.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from tests.pipeline_helpers import live_worker_pids, wait_for
from upwell import names
from upwell.cli import app
from upwell.ingest.blobnames import job_id_for
from upwell.ledger import Ledger
from upwell.local import azurite
from upwell.storage import Storage

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
LANGUAGES = {"sh", "yaml", "text"}
MARKS = {"local", "azure", "suite"}
# `az` commands the README may use, with the flags we checked against `az <command> --help` (Azure CLI 2.x).
AZ_COMMANDS = {"storage blob upload": {"--connection-string", "--container-name", "-c", "--name", "-n", "--file", "-f",
                                       "--overwrite", "--account-name", "--auth-mode", "--no-progress"}}


@dataclass(frozen=True)
class Block:
    line: int  # 1-based line of the opening fence
    language: str
    mark: str | None
    text: str

    def commands(self) -> list[str]:
        """The command lines: backslash continuations joined, blank lines dropped."""
        joined = re.sub(r"\\\n\s*", " ", self.text)
        return [ln.strip() for ln in joined.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def _blocks(text: str) -> list[Block]:
    blocks, lines, start = [], text.splitlines(), None
    for i, line in enumerate(lines):
        if not line.startswith("```"):
            continue
        if start is None:
            start = i
            continue
        before = next((ln.strip() for ln in reversed(lines[:start]) if ln.strip()), "")
        mark = re.fullmatch(r"<!-- example: (\S+) -->", before)
        blocks.append(Block(start + 1, lines[start][3:].strip(), mark[1] if mark else None,
                            "\n".join(lines[start + 1:i])))
        start = None
    assert start is None, f"README.md line {start + 1}: a fence that is never closed"
    return blocks


BLOCKS = _blocks(README)


def _code(line: str) -> str:
    """The command without its trailing comment."""
    return re.sub(r"\s+#.*$", "", line).strip()


def _lines(word: str) -> list[str]:
    return [_code(ln) for b in BLOCKS if b.language == "sh" for ln in b.commands()
            if re.match(rf"^(\S*/)?{word}\b", ln)]


# --- static checks -------------------------------------------------------------------------------------------


def _label_problems(text: str) -> list[str]:
    """What is wrong with the fences and marks of a README: each problem names its line."""
    problems, blocks = [], _blocks(text)
    for b in blocks:
        if b.language not in LANGUAGES:
            problems.append(f"line {b.line}: fence language {b.language!r}; label it one of {sorted(LANGUAGES)}")
        elif b.language == "sh" and b.mark not in MARKS:
            problems.append(f"line {b.line}: a shell block needs `<!-- example: local -->` (run by this test), "
                            "`<!-- example: azure -->` or `<!-- example: suite -->` on the line before it")
        elif b.language != "sh" and b.mark is not None:
            problems.append(f"line {b.line}: a mark belongs before a `sh` block, not a {b.language} one")
    if len(re.findall(r"<!-- example:", text)) != sum(b.mark is not None for b in blocks):
        problems.append("an `<!-- example: ... -->` mark that no fenced block follows")
    return problems


def test_every_block_is_labelled_and_marked():
    assert BLOCKS, "no fenced blocks found in README.md"
    assert _label_problems(README) == []
    assert {b.mark for b in BLOCKS if b.language == "sh"} == MARKS


@pytest.mark.parametrize("text", [
    "```sh\nls\n```\n",  # a shell block without a mark
    "```\nls\n```\n",  # no language
    "```bash\nls\n```\n",  # a shell block under another name
    "<!-- example: maybe -->\n```sh\nls\n```\n",  # an unknown mark
    "<!-- example: local -->\n```yaml\na: 1\n```\n",  # a mark on a block that is not shell
    "<!-- example: local -->\n\ntext\n\n```sh\nls\n```\n",  # a mark that is not right before its block
])
def test_an_unmarked_or_unlabelled_block_is_caught(text):
    assert _label_problems(f"# x\n\n<!-- example: local -->\n```sh\nls\n```\n\n{text}")


def test_every_shell_block_parses():
    for b in BLOCKS:
        if b.language == "sh":
            done = subprocess.run(["bash", "-n"], input=b.text, capture_output=True, text=True)
            assert done.returncode == 0, f"README.md line {b.line}: bash -n: {done.stderr}"


def test_every_upwell_line_uses_the_venv_script_and_parses():
    lines = _lines(r"upwell")
    assert len(lines) >= 12, lines
    group = typer.main.get_command(app)
    for line in lines:
        assert line.startswith(".venv/bin/upwell "), f"bare upwell needs the venv activated: {line}"
        cmd, rest = group, shlex.split(line)[1:]
        while getattr(cmd, "commands", None) is not None:  # a group: walk down to the command
            if rest and rest[0].startswith("-"):  # the group's own option (`upwell --version`)
                assert any(rest[0] in p.opts for p in cmd.params), f"no such option in: {line}"
                break
            assert rest and rest[0] in cmd.commands, f"no such command in: {line}"
            cmd, rest = cmd.commands[rest[0]], rest[1:]
        if getattr(cmd, "commands", None) is None:
            cmd.make_context(cmd.name, rest)  # raises a UsageError for an unknown option or a missing argument


def test_azure_blocks_name_real_commands_flags_and_files():
    runner = CliRunner()
    azure = [b for b in BLOCKS if b.mark == "azure"]
    assert azure
    for b in azure:
        for line in b.commands():
            args = shlex.split(line, comments=True)
            if args[0] == ".venv/bin/upwell":
                words = [a for a in args[1:] if not a.startswith("-")][:2]
                sub = words[:2] if words[:1] == ["payload"] else words[:1]
                result = runner.invoke(app, [*sub, "--help"])
                assert result.exit_code == 0, f"README.md line {b.line}: `upwell {' '.join(sub)} --help`: " \
                                              f"{result.output}"
                continue
            assert args[0] == "az", f"README.md line {b.line}: add a check for {args[0]!r} to this test"
            command = next((c for c in AZ_COMMANDS if args[1:1 + len(c.split())] == c.split()), None)
            assert command, f"README.md line {b.line}: `az {' '.join(args[1:4])}` is not in AZ_COMMANDS"
            flags = {a.split("=")[0] for a in args[1 + len(command.split()):] if a.startswith("-")}
            unknown = flags - AZ_COMMANDS[command]
            assert not unknown, f"README.md line {b.line}: `az {command}` has no flags {unknown}"
            for flag in ("--file", "-f"):
                if flag in args:
                    assert (ROOT / args[args.index(flag) + 1]).is_file(), f"README.md line {b.line}: no such file"


def test_the_az_example_uploads_to_a_path_of_its_own():
    submitted = {m for line in _lines("upwell") if " submit " in line and "--dry-run" not in line
                 for m in re.findall(r"--prefix (\S+)", line)}
    assert submitted
    name = re.search(r"--name (\S+)", " ".join(b.text for b in BLOCKS if "az storage blob upload" in b.text))[1]
    for prefix in submitted:
        assert not name.startswith(f"{prefix}sweep/"), f"{name} is where `upwell submit` already put the sweep"


def test_suite_block_names_make_targets():
    makefile = (ROOT / "Makefile").read_text()
    suite = [c for b in BLOCKS if b.mark == "suite" for c in b.commands()]
    assert [shlex.split(c, comments=True)[:2] for c in suite] == [["make", "demo"], ["make", "test"]]
    for target in ("demo", "test"):
        assert re.search(rf"^{target}:", makefile, flags=re.M), f"no `{target}` target in the Makefile"


def test_yaml_blocks_load_as_the_manifest_or_rule_they_show():
    from upwell.ingest import manifests
    from upwell.payloads.registry import Registry
    from upwell.settings import Settings

    payloads = Registry(None, Settings().registry_allowlist).names()
    shown = [b for b in BLOCKS if b.language == "yaml"]
    assert len(shown) >= 3
    for b in shown:
        load = manifests.load_rule if re.search(r"^match:", b.text, flags=re.M) else manifests.load_manifest
        load(b.text.encode(), f"README.md line {b.line}", payloads)  # raises InputRejected naming the field


def test_license_and_contributing_exist():
    assert "MIT License" in (ROOT / "LICENSE").read_text()
    assert 'license = { text = "MIT" }' in (ROOT / "pyproject.toml").read_text()
    assert "make test-fast" in (ROOT / "CONTRIBUTING.md").read_text()
    assert re.search(r"^test-fast: .*iac-install", (ROOT / "Makefile").read_text(), flags=re.M)


# --- the local examples, run --------------------------------------------------------------------------------


class Reader:
    """Runs README lines as a reader does, from the clone, and keeps what they printed."""

    def __init__(self, clone: Path, tmp: Path):
        self.clone = clone
        self.ports = azurite.free_ports(4)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("UPWELL_", names.CONNECTION))}
        # No AzureWebJobsStorage: the commands find `upwell up` on its moved ports from its state file, as in a
        # reader's second terminal (issue 25 item 2).
        self.connection = azurite.connection_string(*self.ports[:3])
        self.env = {**env, "PYTHONPATH": str(clone), "PATH": f"{clone / '.venv' / 'bin'}{os.pathsep}{env['PATH']}",
                    "UPWELL_RUN_DIR": str(tmp),
                    "COLUMNS": "200", "OMP_NUM_THREADS": "1"}
        self.storage = Storage(self.connection)
        self.up: subprocess.Popen | None = None
        self.up_output: list[str] = []
        self.ready = threading.Event()
        self.job = ""  # the job id the latest `submit` printed
        self.cancelled: list[str] = []  # the shards the latest `cancel` stopped
        self.az_job = ""  # the job of the replayed az upload
        self.timings: list[tuple[float, str]] = []

    def run(self, line: str, timeout: float = 240) -> tuple[str, str]:
        """Its stdout and stderr; it must exit 0."""
        started = time.monotonic()
        done = subprocess.run(["bash", "-c", line], cwd=self.clone, env=self.env, capture_output=True, text=True,
                              timeout=timeout)
        self.timings.append((time.monotonic() - started, line))
        assert done.returncode == 0, f"`{line}` exited {done.returncode}:\n{(done.stdout + done.stderr)[-4000:]}"
        return done.stdout, done.stderr

    def start_up(self, line: str) -> None:
        started = time.monotonic()
        blob, queue, table, http = self.ports
        code = f"{_code(line)} --blob-port {blob} --queue-port {queue} --table-port {table} --http-port {http}"
        env = {k: v for k, v in self.env.items() if k != "OMP_NUM_THREADS"}  # `up` shares the cores out itself
        self.up = subprocess.Popen(["bash", "-c", code], cwd=self.clone, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, start_new_session=True)
        threading.Thread(target=self._read_up, daemon=True).start()
        wait_for(lambda: self.ready.is_set() or self.up.poll() is not None, 120, "`upwell up` to say ready",
                 lambda: "".join(self.up_output)[-3000:])
        assert self.ready.is_set(), f"`upwell up` exited {self.up.returncode}:\n{''.join(self.up_output)[-3000:]}"
        self.timings.append((time.monotonic() - started, f"{line} (until ready)"))

    def _read_up(self) -> None:
        for text in self.up.stdout:
            self.up_output.append(text)
            if text.startswith("ready"):
                self.ready.set()

    def ctrl_c(self) -> str:
        """What a terminal does on Ctrl-C: SIGINT to the foreground process group."""
        started = time.monotonic()
        os.killpg(self.up.pid, signal.SIGINT)
        self.up.wait(90)
        self.timings.append((time.monotonic() - started, "Ctrl-C in the terminal of `upwell up`"))
        return "".join(self.up_output)

    def leave_nothing(self) -> None:
        """After a failure: stop `up`; if Ctrl-C does not, kill it, the devhost and Azurite it started (each in its
        own session) and its workers."""
        if self.up is None or self.up.poll() is not None:
            return
        try:
            self.ctrl_c()
        except subprocess.TimeoutExpired:
            ours = ["--blobPort", str(self.ports[0])]  # the Azurite on this test's own free port
            azurites = [pid for pid in filter(str.isdigit, os.listdir("/proc"))
                        if any(_argv(pid)[i:i + 2] == ours for i in range(len(_argv(pid))))]
            for pid in [*re.findall(r"devhost pid (\d+)", "".join(self.up_output)),
                        *live_worker_pids(self.clone / ".upwell" / "pools"), *azurites, self.up.pid]:
                try:
                    os.killpg(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass


def _argv(pid: str) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().split("\0")
    except OSError:
        return []


def _check(reader: Reader, line: str, stdout: str, stderr: str) -> None:
    """What the README says each command shows (``out``: stdout and stderr; the path, the log and the JSON are
    read from stdout alone). A command not named here only has to exit 0."""
    args = shlex.split(line, comments=True)[1:]
    check = {"payload": _check_payload, "rerun": _check_lifecycle, "cancel": _check_lifecycle,
             "logs": _check_lifecycle, "delete": _check_lifecycle, "prune": _check_lifecycle}.get(args[0], _check_job)
    check(reader, args, stdout, stdout + stderr)


def _check_job(reader: Reader, args: list[str], stdout: str, out: str) -> None:
    ledger, job = Ledger(reader.storage), reader.job
    match args:
        case ["submit", *_, "--dry-run"]:
            assert "estimate" in out and "dry run: nothing uploaded" in out, out
            assert not list(reader.storage.list(names.INCOMING)), "a dry run uploaded something"
        case ["submit", *_]:
            ids = re.findall(r"\(job (\S+)\)", out)
            assert len(ids) == 1, out
            reader.job = ids[0]
        case ["watch", _]:
            row = ledger.job(job)
            assert row.reported and row.status.value == "succeeded", (row, out)
            assert re.search(r"\d+ done 0 failed \| workers \d+ \| \$[\d.]+ \| succeeded", out), out
        case ["status"]:
            assert re.search(rf"^\S*\s*{re.escape(job)}\s.*succeeded", out, flags=re.M), out
        case ["status", _]:
            assert job in out and "succeeded" in out and "shards: 12 done, 0 failed" in out, out
        case ["report", _]:
            index = reader.clone / ".upwell" / "reports" / job / "index.html"
            assert stdout.strip() == str(index) and index.is_file(), out


def _check_lifecycle(reader: Reader, args: list[str], stdout: str, out: str) -> None:
    ledger, job = Ledger(reader.storage), reader.job
    match args:
        case ["rerun", _, "--all"]:
            assert f"re-running 12 shard(s) of {job}" in out, out
        case ["cancel", _]:
            assert f"cancelled {job}:" in out and ledger.job(job).status.value == "cancelled", out
            reader.cancelled = [s.shard_id for s in ledger.shards(job) if s.status.value == "cancelled"]
            assert reader.cancelled, f"nothing was left to cancel: {out}"
            # Per state, every shard once; only the shards that are cancelled now are reported as stopped or
            # cancelled (one that finished before it could stop is not: issue 25 item 11).
            moves = [(int(n), was, what) for n, was, what in re.findall(r"^\s+(\d+) (\w+)\s+(.+)$", out, flags=re.M)]
            assert sum(n for n, _, _ in moves) == 12, out
            stopped = sum(n for n, _, what in moves if "cancelled" in what or "checkpointed" in what)
            stopping = sum(n for n, _, what in moves if "still stopping" in what)  # may be cancelled by now
            assert stopped <= len(reader.cancelled) <= stopped + stopping, (reader.cancelled, out)
        case ["rerun", _]:
            assert re.search(rf"re-running {len(reader.cancelled)} shard\(s\) of {re.escape(job)}: ", out), out
            assert all(s in out for s in reader.cancelled[:20]), (reader.cancelled, out)
        case ["logs", _, shard]:  # the sample's logistic prints nothing, so keeps no log: logs says so
            if reader.storage.exists(f"results/{job}/{shard}/payload.log"):
                assert stdout.strip() and stdout == reader.storage.read(f"results/{job}/{shard}/payload.log").decode()
            else:
                assert stdout == "" and "(no output)" in out, out
        case ["delete", path, "--yes"]:
            assert re.search(rf"deleted {re.escape(job)}: [1-9]\d* blob\(s\), [1-9]\d* row\(s\)", out), out
            assert f"delete {job} (succeeded): " in out, out  # it said what it would remove
            assert ledger.job(job) is None and not list(reader.storage.list(names.INCOMING, f"{path}/"))
        case ["prune", "--older-than", _]:
            assert "0 job(s) pruned" in out, out


def _check_payload(reader: Reader, args: list[str], stdout: str, out: str) -> None:
    if args[1] == "list":
        for name in ("logistic", "channel-stats", "welch", "heat-mpi", "train-torch"):
            assert re.search(rf"^{name}\s", out, flags=re.M), out
        return
    name, rest = args[2], args[3:]
    result = json.loads(stdout)
    assert result["status"] == "succeeded", result
    if "--out" in rest:
        where = reader.clone / rest[rest.index("--out") + 1]
        assert (where / "payload.log").is_file() and (where / "result.json").is_file()
    metrics = result["metrics"]
    if name == "heat-mpi":  # the accuracy the README's payload table holds it to
        assert metrics["l2_error"] < 1e-5, metrics
    elif name == "train-torch":
        assert metrics["test_accuracy"] >= 0.95, metrics
    elif name == "welch":
        assert metrics["fs"] == 20.0 and metrics["rows"] == 4000, metrics


def _as_az_would(reader: Reader, block: Block) -> None:
    """The `az storage blob upload` example, made with the SDK; then the status line the README gives after it."""
    args = shlex.split(block.commands()[0], comments=True)
    container, name, local = (args[args.index(f) + 1] for f in ("--container-name", "--name", "--file"))
    etag = reader.storage.blob(container, name).upload_blob((reader.clone / local).read_bytes())["etag"]
    job_id = job_id_for(name, etag)
    started = time.monotonic()
    wait_for(lambda: Ledger(reader.storage).job(job_id), 60, f"the job of the az upload {name} to be ingested")
    reader.timings.append((time.monotonic() - started, "(the az upload, made with the SDK, and its ingest)"))
    after = README[README.index(block.text) + len(block.text):]
    status = re.search(r"`(\.venv/bin/upwell status [^`]+)`", after.split("\n\n", 2)[1])[1]
    out = "".join(reader.run(status))
    assert job_id in out and re.search(r"accepted|running|succeeded", out), out
    reader.az_job = job_id
