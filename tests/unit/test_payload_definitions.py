"""Payload definitions: the model, the committed schema, named errors with paths, param validation."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from upwell.errors import InputRejected
from upwell.payloads import params as payload_params
from upwell.payloads import schema
from upwell.payloads.definition import registry_of, render
from upwell.payloads.registry import builtins
from upwell.payloads.validate import DefinitionError, load, problems

ALLOW = ("*.azurecr.io", "ghcr.io")
DIGEST = "sha256:" + "ab" * 32
GOOD = {
    "schema": 1, "name": "wc-lines", "version": "1.0.0", "owner": "lab", "description": "count lines",
    "image": f"labcr.azurecr.io/tools/wc@{DIGEST}",
    "command": ["wc", "-l", "{input}", "--label={label}"],
    "params": {"label": {"type": "str", "default": "x", "pattern": "[a-z]+"},
               "n": {"type": "int", "default": 3, "min": 1, "max": 10},
               "t": {"type": "float", "default": 300.0, "min": 200, "max": 400},
               "mode": {"type": "enum", "default": "fast", "choices": ["fast", "slow"]},
               "verbose": {"type": "bool", "default": False},
               "sub": {"type": "path", "default": "data/a.txt"}},
    "input": {"required": True, "path": "input/data.csv"},
    "outputs": {"metrics_regex": {"lines": r"^\s*(\d+)"}},
}


def _codes(doc: dict) -> list[tuple[str, str]]:
    return [(p.code, p.path) for p in problems(doc, ALLOW)[1]]


def _with(**changes) -> dict:
    doc = copy.deepcopy(GOOD)
    doc.update(changes)
    return doc


def test_good_definition_has_no_problems():
    definition, found = problems(GOOD, ALLOW)
    assert found == [] and definition is not None
    assert definition.digest == DIGEST


@pytest.mark.parametrize(("change", "code", "path"), [
    ({"image": "labcr.azurecr.io/tools/wc:1.2"}, "image-not-digest", "image"),
    ({"image": "labcr.azurecr.io/tools/wc"}, "image-not-digest", "image"),
    ({"image": f"docker.io/library/ubuntu@{DIGEST}"}, "registry-not-allowed", "image"),
    ({"image": f"ubuntu@{DIGEST}"}, "registry-not-allowed", "image"),
    ({"command": ["wc", "-l", "{inptu}"]}, "unknown-placeholder", "command[2]"),
    ({"prepare": [["cp", "{nope}", "x"]]}, "unknown-placeholder", "prepare[0][1]"),
    ({"files": {"a.cfg": "n = {n}\nm = {missing}\n"}}, "unknown-placeholder", "files.a.cfg"),
    ({"outputs": {"post": [{"command": ["x"], "stdin": "{nope}"}]}}, "unknown-placeholder", "outputs.post[0].stdin"),
    ({"outputs": {"post": [{"command": "gmx energy -f md.edr"}]}}, "command-not-argv", "outputs.post[0].command"),
    ({"params": {"label": {"default": "x"}}}, "param-without-type", "params.label.type"),
    ({"params": {"label": "str"}}, "param-without-type", "params.label.type"),
    ({"command": "wc -l {input} | sort"}, "command-not-argv", "command"),
    ({"checkpoint": {"resume": "-cpi state.cpt"}}, "command-not-argv", "checkpoint.resume"),
])
def test_named_errors_with_their_path(change, code, path):
    assert (code, path) in _codes(_with(**change))


def test_every_problem_is_reported_at_once():
    doc = _with(image="docker.io/x/y:latest", command="sh -c 'rm -rf /'",
                params={"p": {"default": 1}})
    found = _codes(doc)
    assert {c for c, _ in found} >= {"image-not-digest", "registry-not-allowed", "command-not-argv",
                                     "param-without-type"}
    with pytest.raises(DefinitionError) as exc:
        load(yaml.safe_dump(doc).encode(), "bad.yaml", ALLOW)
    assert len(exc.value.problems) >= 4 and exc.value.field == exc.value.problems[0].path


@pytest.mark.parametrize(("change", "path"), [
    ({"launcher": {"kind": "srun"}}, "launcher.kind"),
    ({"outputs": {"artifacts": ["../../etc/passwd"]}}, "outputs.artifacts[0]"),
    ({"files": {"/etc/cron.d/x": "y"}}, "files./etc/cron.d/x"),
    ({"params": {"workdir": {"type": "str", "default": "x"}}}, "params"),
    ({"params": {"m": {"type": "enum", "default": "a"}}}, "params.m"),
    ({"extra": 1}, "extra"),
    ({"params": {"n": {"type": "int", "default": 30, "max": 10}}}, "params.n.default"),
    ({"command": ["wc", "{opt}"], "params": {"opt": {"type": "str"}}}, "params.opt"),
])
def test_other_problems_name_their_path(change, path):
    found = _codes(_with(**change))
    assert any(p == path or p.startswith(path + ".") for _, p in found), found


def test_committed_schema_equals_generated():
    assert schema.PATH.read_text() == schema.text(), "regenerate: python -m upwell.payloads.schema"
    doc = json.loads(schema.PATH.read_text())
    assert doc["x-schema-version"] == 1 and "command" in doc["required"] and "image" in doc["required"]
    assert doc["properties"]["command"]["type"] == "array"
    assert "@sha256:" in doc["properties"]["image"]["pattern"]
    assert doc["$defs"]["Param"]["required"] == ["type"]


def test_builtins_are_definitions_and_match_their_param_models():
    from upwell.payloads.params import BUILTIN_MODELS

    found = builtins()
    assert {"logistic", "channel-stats", "welch", "heat-mpi", "train-torch", "gromacs-md"} <= set(found)
    for name, loaded in found.items():
        d = loaded.definition
        assert loaded.sha256.startswith("sha256:") and d.image.count("@sha256:") == 1, name
        if d.module:
            model = BUILTIN_MODELS[d.module]
            assert set(d.params) == set(model.model_fields), name
            defaults = {k: f.default for k, f in model.model_fields.items() if f.default is not None}
            assert payload_params.validate(d, {}) == defaults, name



def test_the_warm_runner_preloads_every_plain_builtin_payload():
    """workers.payloads.PRELOAD names the modules of the built-ins that run as one Python process, no other."""
    from workers.payloads import PRELOAD

    plain = {loaded.definition.module for loaded in builtins().values()
             if loaded.definition.module and loaded.definition.launcher.kind == "plain"}
    preloaded = {m for m in PRELOAD if m.startswith("workers.payloads.")} - {"workers.payloads.common"}
    assert plain == preloaded
    assert "torch" not in PRELOAD and "workers.payloads.train" not in PRELOAD


def test_a_payload_process_imports_no_definition_machinery():
    """The payload contract (exit codes, checkpoints) loads neither the definitions nor their parsers."""
    import subprocess
    import sys

    code = ("import sys, workers.payloads.common; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('pydantic', 'yaml', 'packaging', 'azure', 'structlog') or m.startswith('upwell.payloads.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['upwell.payloads.builtin']"

def test_params_validated_against_the_definition():
    definition = problems(GOOD, ALLOW)[0]
    ok = payload_params.validate(definition, {"n": 5, "t": 280})
    assert ok["n"] == 5 and ok["t"] == 280.0 and ok["label"] == "x"
    for bad, field in [({"n": 11}, "params.n"), ({"n": 2.5}, "params.n"), ({"n": True}, "params.n"),
                       ({"t": "hot"}, "params.t"), ({"t": float("nan")}, "params.t"),
                       ({"label": "A;rm"}, "params.label"), ({"mode": "medium"}, "params.mode"),
                       ({"verbose": "yes"}, "params.verbose"), ({"sub": "../x"}, "params.sub"),
                       ({"sub": "/etc/passwd"}, "params.sub"), ({"bogus": 1}, "params.bogus")]:
        with pytest.raises(InputRejected) as exc:
            payload_params.validate(definition, bad)
        assert exc.value.field == field, bad


def test_placeholder_is_one_argv_element_and_inert():
    value = "a b; rm -rf / $(x) `y` | z"
    assert render("--label={label}", {"label": value}) == f"--label={value}"
    assert render("{{literal}}", {}) == "{literal}"


def test_registry_host_rules():
    assert registry_of("labcr.azurecr.io/a/b@x") == "labcr.azurecr.io"
    assert registry_of("localhost:5000/a@x") == "localhost:5000"
    assert registry_of("library/ubuntu@x") == "docker.io"
