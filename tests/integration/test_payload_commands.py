"""`upwell payload run FILE.yaml`, `payload delete`, the `dev` tag and the `${name}` warning (issue 25
items 4, 5), through the real `upwell` command against Azurite.

- a definition file runs once under the agent's contract, with nothing pushed;
- a pushed version is immutable, `dev` is pushed over; a bare name never resolves to `dev`;
- `payload delete NAME@VERSION` and a push over `dev` are refused with PayloadInUse while an open job
  runs that version, and go through once the job has ended;
- `payload validate` warns (exit 0) when a param would swallow the tool's own `${name}`.
"""

from __future__ import annotations

import json
import uuid

import pytest
import yaml
from typer.testing import CliRunner

from tests.pipeline_helpers import ingest_manifest
from upwell import logs, names
from upwell.cli import app
from upwell.errors import InputRejected
from upwell.payloads.registry import Registry
from upwell.storage import Storage

logs.configure()  # to pytest's stderr, not to a CliRunner stream that closes after the command
TOOL = "import json, pathlib, sys; pathlib.Path('out').mkdir(exist_ok=True); " \
       "json.dump({'twice': 2 * int(sys.argv[1])}, open('out/m.json', 'w')); print('ran', sys.argv[1])"


def _definition(name: str, version: str, greeting: str = "hi", **extra) -> dict:
    return {"schema": 1, "name": name, "version": version, "owner": "a test lab", "description": greeting,
            "image": "labcr.azurecr.io/tools/echo@sha256:" + "4d" * 32,
            "params": {"n": {"type": "int", "default": 1, "min": 0, "max": 100}},
            "command": ["{python}", "-c", TOOL.replace("{", "{{").replace("}", "}}"), "{n}"],
            "outputs": {"metrics_json": "out/m.json"}, **extra}


def _write(tmp_path, doc: dict, name: str = "def.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def _cli(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture
def store(storage_env) -> Storage:
    store = Storage(storage_env)
    store.ensure()
    return store


def test_a_definition_file_runs_once_without_a_push(store, tmp_path):
    name = f"try-{uuid.uuid4().hex[:8]}"
    path = _write(tmp_path, _definition(name, "0.1.0"))
    ran = _cli("payload", "run", str(path), "--param", "n=21", "--out", str(tmp_path / "out"))
    assert ran.exit_code == 0, ran.output
    doc = json.loads(ran.output[ran.output.index("{"):])
    assert doc["status"] == "succeeded" and doc["metrics"] == {"twice": 42}
    assert doc["definition"]["name"] == name and (tmp_path / "out" / "payload.log").read_text().count("ran 21") == 1
    assert list(store.list(names.PAYLOADS, f"{name}/")) == []  # nothing pushed
    bad = _cli("payload", "run", str(path), "--param", "n=500")
    assert bad.exit_code == 2 and "n" in bad.output


def test_dev_is_pushed_over_and_a_used_version_is_neither_deleted_nor_overwritten(store, tmp_path):
    name = f"tool-{uuid.uuid4().hex[:8]}"
    released = _write(tmp_path, _definition(name, "1.0.0"), "v1.yaml")
    assert _cli("payload", "push", str(released)).exit_code == 0
    changed = _write(tmp_path, _definition(name, "1.0.0", greeting="changed"), "v1b.yaml")
    refused = _cli("payload", "push", str(changed))
    assert refused.exit_code == 2 and "a version never changes" in refused.output
    for greeting in ("first", "second"):  # dev is a tag: pushed over
        pushed = _cli("payload", "push", str(_write(tmp_path, _definition(name, "dev", greeting), "dev.yaml")))
        assert pushed.exit_code == 0 and "registered" in pushed.output, pushed.output
    registry = Registry(store, ("*.azurecr.io",))
    assert registry.resolve(f"{name}@dev").definition.description == "second"
    assert registry.resolve(name).definition.version == "1.0.0"  # a bare name: the newest released version

    dev_job = ingest_manifest(store, f"tag/{name}/dev/job.yaml", f"payload: {name}@dev\ngrid: {{n: [1]}}\n")
    job = ingest_manifest(store, f"tag/{name}/v1/job.yaml", f"payload: {name}@1.0.0\ngrid: {{n: [1]}}\n")
    in_use = _cli("payload", "delete", f"{name}@1.0.0")
    assert in_use.exit_code == 2 and "PayloadInUse" in in_use.output and job in in_use.output, in_use.output
    over = _cli("payload", "push", str(_write(tmp_path, _definition(name, "dev", "third"), "dev.yaml")))
    assert over.exit_code == 2 and "PayloadInUse" in over.output and dev_job in over.output, over.output

    for j in (job, dev_job):
        assert _cli("cancel", j, "--wait", "0").exit_code == 0
    deleted = _cli("payload", "delete", f"{name}@1.0.0")
    assert deleted.exit_code == 0 and f"deleted: {name}@1.0.0" in deleted.output, deleted.output
    assert _cli("payload", "push", str(_write(tmp_path, _definition(name, "dev", "third"), "dev.yaml"))).exit_code == 0
    with pytest.raises(InputRejected, match="only a dev version"):
        registry.resolve(name)
    missing = _cli("payload", "delete", f"{name}@1.0.0")
    assert missing.exit_code == 2 and "is not registered" in missing.output
    assert "name the version" in _cli("payload", "delete", name).output


def test_validate_warns_when_a_param_swallows_the_tools_own_variable(tmp_path):
    doc = _definition("lammps-like", "1.0.0", files={"in.lmp": "variable n equal 3\nprint ${n} and ${{n}}\n"})
    out = _cli("payload", "validate", str(_write(tmp_path, doc)))
    assert out.exit_code == 0, out.output
    assert "warning: files.in.lmp: ${n} is substituted with the param 'n'" in out.output
    assert "write ${{n}}" in out.output and "[param-shadows-tool-variable]" in out.output
