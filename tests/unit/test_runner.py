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
    kept = int((tmp_path / "a1" / "ckpt" / "state.txt").read_text())
    assert 0 < kept < 200
    second = run_definition(counter, item(n=200, delay=0.0), tmp_path / "a2", resume_dir=tmp_path / "a1" / "ckpt")
    assert second.status == "succeeded" and second.resumed_from == "checkpoint"
    assert f"starting from {kept}" in (tmp_path / "a2" / "payload.log").read_text()
    log = (tmp_path / "a2" / "payload.log").read_text().splitlines()
    assert [line for line in log if line.startswith("$ ") and "tool.py" in line][0].endswith("0 --resume")
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
