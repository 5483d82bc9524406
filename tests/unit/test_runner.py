"""The argv runner (workers/runner.py) with small real processes: how an attempt ends, checkpoints kept
and restored, metrics from a JSON file, a log regex and a post-step, artifacts, a missing tool."""

from __future__ import annotations

import json
import threading
import time

import pytest
import yaml

from upwell.errors import InputRejected
from upwell.messages import WorkItem
from upwell.payloads.validate import load
from workers.runner import run_definition

# A tool in Python: counts to {n}, keeps its count in state.txt on SIGTERM (then exits 1, as mdrun
# does), continues from state.txt when given --resume, writes out/result.json, exits {code} at the end.
TOOL = r"""
import json, signal, sys, time, pathlib
state = pathlib.Path("state.txt")
i = int(state.read_text()) if "--resume" in sys.argv else 0
print("starting from", i, flush=True)
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
while i < int(sys.argv[1]):
    if stop:
        state.write_text(str(i)); print("stopped at", i, flush=True); sys.exit(1)
    i += 1; time.sleep(float(sys.argv[2]))
pathlib.Path("out").mkdir(exist_ok=True)
json.dump({"count": i}, open("out/result.json", "w"))
print("total =", i, flush=True)
sys.exit(int(sys.argv[3]))
"""


def definition(**changes) -> bytes:
    doc = {"schema": 1, "name": "counter", "version": "1.0.0", "owner": "test",
           "image": "labcr.azurecr.io/counter@sha256:" + "1" * 64,
           "files": {"tool.py": TOOL.replace("{", "{{").replace("}", "}}")},
           "command": ["{python}", "tool.py", "{n}", "{delay}", "{code}"],
           "params": {"n": {"type": "int", "default": 5}, "delay": {"type": "float", "default": 0.0},
                      "code": {"type": "int", "default": 0}},
           "checkpoint": {"files": ["state.txt"], "resume": ["--resume"], "grace_s": 10},
           "exit_codes": {"preempted": [75], "bad_input": [65]},
           "outputs": {"metrics_json": "out/result.json", "metrics_regex": {"total": r"^total = (\d+)"},
                       "artifacts": ["tool.py"],
                       "post": [{"command": ["{python}", "-c", "import sys; print('lines', len(sys.stdin.read()))"],
                                 "stdin": "n={n}", "metrics_regex": {"stdin_chars": r"^lines (\d+)"}}]}}
    doc.update(changes)
    return yaml.safe_dump(doc).encode()


def item(**params) -> WorkItem:
    return WorkItem(job_id="j", shard_id="s", payload="counter", pool="cpu", params=params)


@pytest.fixture
def counter():
    return load(definition(), "counter.yaml", ("*.azurecr.io",))


def test_success_collects_metrics_from_json_regex_and_post_step(counter, tmp_path):
    result = run_definition(counter, item(n=4), tmp_path)
    assert result.status == "succeeded", result.stderr_tail
    assert result.metrics == {"count": 4, "total": 4.0, "stdin_chars": 3.0}
    assert sorted(p.name for p in result.artifacts) == ["result.json", "tool.py"]
    assert result.definition["name"] == "counter" and result.definition["sha256"] == counter.sha256


def test_stop_keeps_the_checkpoint_and_the_next_attempt_resumes(counter, tmp_path):
    stop = threading.Event()
    threading.Timer(1.5, stop.set).start()
    first = run_definition(counter, item(n=200, delay=0.02), tmp_path / "a1", stop=stop)
    assert first.status == "preempted" and first.exit_code == 1 and first.checkpoints == 1, first.stderr_tail
    kept = int((first.checkpoint_dir / "state.txt").read_text())
    assert 0 < kept < 200
    second = run_definition(counter, item(n=200, delay=0.0), tmp_path / "a2", resume_dir=first.checkpoint_dir)
    assert second.status == "succeeded" and second.resumed_from == "checkpoint"
    assert f"starting from {kept}" in (tmp_path / "a2" / "payload.log").read_text()
    log = (tmp_path / "a2" / "payload.log").read_text().splitlines()
    assert [line for line in log if line.startswith("$ ") and "tool.py" in line][0].endswith("0 --resume")
    # the command lines are the launcher's, not the payload's output: log_bytes counts everything else
    ours = sum(len(line) + 1 for line in log if line.startswith("$ "))
    assert second.log_bytes == len((tmp_path / "a2" / "payload.log").read_bytes()) - ours > 0
    assert second.metrics["count"] == 200


@pytest.mark.parametrize(("code", "status", "permanent"), [(65, "failed", True), (75, "preempted", False),
                                                           (3, "failed", False)])
def test_exit_codes(counter, tmp_path, code, status, permanent):
    result = run_definition(counter, item(n=1, code=code), tmp_path)
    assert (result.status, result.permanent, result.exit_code) == (status, permanent, code)
    assert result.metrics == {}


def test_a_failing_post_step_fails_the_attempt(tmp_path):
    loaded = load(definition(outputs={"post": [{"command": ["{python}", "-c", "import sys; sys.exit(4)"]}]}),
                  "c.yaml", ("*.azurecr.io",))
    result = run_definition(loaded, item(n=1), tmp_path)
    assert result.status == "failed" and "exited 4" in result.stderr_tail


def test_a_missing_tool_fails_with_its_name(tmp_path):
    loaded = load(definition(command=["no-such-tool-upwell", "{n}"]), "c.yaml", ("*.azurecr.io",))
    result = run_definition(loaded, item(), tmp_path)
    assert result.status == "failed" and result.exit_code == 127 and "no-such-tool-upwell" in result.stderr_tail


def test_bad_params_never_start_the_tool(counter, tmp_path):
    with pytest.raises(InputRejected) as exc:
        run_definition(counter, item(n="5; touch owned"), tmp_path)
    assert exc.value.field == "params.n" and not (tmp_path / "owned").exists()
    assert not (tmp_path / "payload.log").exists()


def test_timeout_fails(counter, tmp_path):
    started = time.monotonic()
    result = run_definition(counter, item(n=1000, delay=0.05), tmp_path, timeout_s=1.0)
    assert result.status == "failed" and result.timed_out and time.monotonic() - started < 20
    assert json.loads(json.dumps(result.to_dict(), default=str))["timed_out"] is True


# The checkpoint trap (issue 25 item 3): only the declared checkpoint counts; a truncated or unreadable one is
# dropped for a fresh start that the result names.
TRAP_TOOL = r"""
import pathlib, sys
log = pathlib.Path("ckpt/tool.log"); log.parent.mkdir(exist_ok=True); log.write_text("a log, not a checkpoint\n")
state = pathlib.Path("state.chk")
if "--resume" in sys.argv:
    text = state.read_text()
    if not text.endswith("END\n"):
        print("cannot read state.chk: truncated", flush=True); sys.exit(3)
    print("resumed at", text.split()[0], flush=True)
if sys.argv[1] == "truncate":
    state.write_text("7 half-writ"); sys.exit(75)
if sys.argv[1] == "log-only":
    sys.exit(75)
print("done", flush=True)
"""


def trap(**checkpoint) -> object:
    doc = yaml.safe_load(definition())
    doc["files"] = {"trap.py": TRAP_TOOL.replace("{", "{{").replace("}", "}}")}
    doc["command"] = ["{python}", "trap.py", "{mode}"]
    doc["params"] = {"mode": {"type": "str", "default": "run"}}
    doc["outputs"] = {}
    doc["checkpoint"] = {"files": ["state.chk"], "resume": ["--resume"], **checkpoint}
    return load(yaml.safe_dump(doc).encode(), "trap.yaml", ("*.azurecr.io",))


def test_a_log_in_the_checkpoint_folder_is_not_a_checkpoint(tmp_path):
    first = run_definition(trap(), item(mode="log-only"), tmp_path / "a1")
    assert first.status == "preempted" and first.checkpoints == 0
    assert not [p for p in first.checkpoint_dir.rglob("*") if p.is_file()]  # nothing to upload
    (tmp_path / "left").mkdir()
    (tmp_path / "left" / "ckpt").mkdir()
    (tmp_path / "left" / "ckpt" / "tool.log").write_text("left by an older agent")
    second = run_definition(trap(), item(mode="run"), tmp_path / "a2", resume_dir=tmp_path / "left")
    assert second.status == "succeeded" and second.resumed_from is None and second.checkpoint_note == ""


def test_a_truncated_checkpoint_falls_back_to_a_fresh_start(tmp_path):
    first = run_definition(trap(), item(mode="truncate"), tmp_path / "a1")
    assert first.status == "preempted" and first.checkpoints == 1
    second = run_definition(trap(), item(mode="run"), tmp_path / "a2", resume_dir=first.checkpoint_dir)
    assert second.status == "succeeded", second.stderr_tail
    assert second.resumed_from is None and "could not resume" in second.checkpoint_note
    log = (tmp_path / "a2" / "payload.log").read_text()
    assert "cannot read state.chk" in log and log.rstrip().endswith("done")


def test_an_empty_checkpoint_or_one_failing_verify_is_never_resumed(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "state.chk").write_bytes(b"")
    empty = run_definition(trap(), item(), tmp_path / "a1", resume_dir=tmp_path / "empty")
    assert empty.status == "succeeded" and "empty (truncated)" in empty.checkpoint_note
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "state.chk").write_text("7 END\n")
    verify = ["{python}", "-c", "import sys; sys.exit('bad magic')"]
    checked = run_definition(trap(verify=verify), item(), tmp_path / "a2", resume_dir=tmp_path / "bad")
    assert checked.status == "succeeded" and "verify step (exit 1: bad magic)" in checked.checkpoint_note
    good = run_definition(trap(verify=["{python}", "-c", "pass"]), item(), tmp_path / "a3",
                          resume_dir=tmp_path / "bad")
    assert good.resumed_from == "checkpoint" and "resumed at 7" in (tmp_path / "a3" / "payload.log").read_text()


def test_only_the_newest_checkpoint_is_kept_unless_history_is_asked(tmp_path):
    import os

    from workers import checkpoints

    (tmp_path / "w" / "ckpt").mkdir(parents=True)
    for k, name in enumerate(("restart.300", "restart.100", "restart.200")):
        (tmp_path / "w" / name).write_text(name)
        os.utime(tmp_path / "w" / name, ns=(0, {0: 3, 1: 1, 2: 2}[k] * 10**9))  # newest: the last written

    newest = yaml.safe_load(definition())
    newest["checkpoint"] = {"files": ["restart.*"], "keep": ["*.log"]}
    (tmp_path / "w" / "run.log").write_text("log")
    d = load(yaml.safe_dump(newest).encode(), "c.yaml", ("*.azurecr.io",)).definition
    kept, n = checkpoints.keep(d, tmp_path / "w")
    assert n == 1 and sorted(p.name for p in kept.rglob("*")) == ["restart.300", "run.log"]
    two = d.model_copy(update={"checkpoint": d.checkpoint.model_copy(update={"history": 2})})
    kept, n = checkpoints.keep(two, tmp_path / "w")
    assert n == 2 and sorted(p.name for p in kept.rglob("*")) == ["restart.200", "restart.300", "run.log"]


def test_the_tools_version_is_asked_once_per_node_and_definition(tmp_path):
    asked = tmp_path / "asked.txt"
    doc = yaml.safe_load(definition())
    doc["version_command"] = ["{python}", "-c", f"open({str(asked)!r}, 'a').write('x'); "
                              "print('banner'); print('counter version 2.4.1 (double precision)')"]
    loaded = load(yaml.safe_dump(doc).encode(), "v.yaml", ("*.azurecr.io",))
    first = run_definition(loaded, item(n=1), tmp_path / "a1")
    second = run_definition(loaded, item(n=1), tmp_path / "a2")
    assert first.definition["tool_version"] == second.definition["tool_version"] == \
        "counter version 2.4.1 (double precision)"
    assert asked.read_text() == "x"  # once for both shards
    # the probe's output is in the first attempt's log but is not the payload's: both printed as much
    assert "banner" in (tmp_path / "a1" / "payload.log").read_text() and first.log_bytes == second.log_bytes
    assert "tool_version" not in run_definition(load(definition(), "c.yaml", ("*.azurecr.io",)), item(n=1),
                                                tmp_path / "a3").definition


def test_a_result_records_the_nodes_digest_for_the_built_ins_placeholder():
    from upwell import provenance

    real = "sha256:" + "ab" * 32
    assert provenance.image_digest(provenance.ZERO_DIGEST, real) == real
    assert provenance.image_digest("", "local") == "local"
    assert provenance.image_digest("sha256:" + "cd" * 32, real) == "sha256:" + "cd" * 32  # a lab's own pin


@pytest.mark.parametrize(("output", "expected"), [
    ("  :-) GROMACS - gmx, 2022.5-Debian (-:\nCommand line:\n  gmx --version\n\nGROMACS version:    2022.5-Debian\n",
     "GROMACS version:    2022.5-Debian"),
    ("Python 3.11.7\n", "Python 3.11.7"),
    ("LAMMPS (2 Aug 2023 - Update 1)\nusage: ...\n", "LAMMPS (2 Aug 2023 - Update 1)"),
    ("\n\n", ""),
])
def test_the_version_line_is_the_one_that_gives_a_version(output, expected):
    from upwell.provenance import tool_version

    assert tool_version(output) == expected
