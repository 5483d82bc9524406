"""``upwell access`` on the local stack, and item 4 of issue 27: only operators push payload definitions
(and pipeline rules).

The roles live in UPWELL_ACCESS_FILE; the CLI acts as UPWELL_PRINCIPAL. A submitter's push is refused
with NotOperator and writes nothing; an operator's push is registered and records who pushed it; a
revoked operator is refused again. Real Azurite, the real CLI.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from upwell import names
from upwell.access import grammar
from upwell.cli import app
from upwell.storage import Storage

pytestmark = pytest.mark.access

DEFINITION = """
schema: 1
name: column-count
version: {version}
owner: a test lab
description: Counts the rows of a CSV shard.
image: labcr.azurecr.io/tools/wc@sha256:{digest}
pool: cpu
input: {{required: true, path: input/shard.csv}}
command: [wc, -l, "{{input}}"]
outputs:
  metrics_regex: {{rows: '^\\s*(\\d+)'}}
""".replace("{digest}", "7a" * 32)


def cli(*args: str):
    try:
        return CliRunner().invoke(app, list(args), catch_exceptions=False)
    finally:
        from upwell import logs

        logs.configure()  # the call's logging wrote to CliRunner's stream, closed now


@pytest.fixture
def env(azurite, tmp_path, monkeypatch):
    monkeypatch.setenv(names.CONNECTION, azurite.connection_string)
    monkeypatch.setenv("UPWELL_ACCESS_FILE", str(tmp_path / "access.json"))
    monkeypatch.delenv("UPWELL_ACCESS_SCOPE", raising=False)
    Storage(azurite.connection_string).ensure()
    return tmp_path


def definition(tmp_path, version: str):
    path = tmp_path / f"def-{version}.yaml"
    path.write_text(DEFINITION.format(version=version))
    return path


def test_only_operators_push_and_the_definition_records_who(env, azurite, monkeypatch):
    store = Storage(azurite.connection_string)
    assert cli("access", "grant", "ann", "--project", "ocean", "--role", "submitter").exit_code == 0
    assert cli("access", "grant", "bo", "--project", "ocean", "--role", "operator").exit_code == 0
    again = cli("access", "grant", "bo", "--project", "ocean", "--role", "operator")
    assert again.exit_code == 0 and "already granted" in again.output
    bad = cli("access", "grant", "bo", "--project", "Ocean!", "--role", "operator")
    assert bad.exit_code == 2 and "BadProject" in bad.output
    rows = json.loads((env / "access.json").read_text())
    assert sorted((r["principal"], r["description"]) for r in rows) == [
        ("ann", "upwell-access project=ocean role=submitter"), ("bo", "upwell-access project=ocean role=operator")]
    for r in rows:
        grammar.parse(r["condition"])
    listed = cli("access", "list", "--project", "ocean")
    assert "ann" in listed.output and "operator" in listed.output

    monkeypatch.setenv("UPWELL_PRINCIPAL", "ann")
    refused = cli("payload", "push", str(definition(env, "1.0.0")))
    assert refused.exit_code == 2 and "NotOperator" in refused.output and "ann" in refused.output
    assert not store.exists(f"{names.PAYLOADS}/column-count/1.0.0.yaml")
    rule = env / "access-buoy.yaml"  # a name of its own: the session's Azurite may hold another test's buoy rule
    rule.write_text("name: access-buoy\nmatch: 'ocean/access-buoy/*.csv'\npayload: welch\n")
    refused_rule = cli("rules", str(rule))
    assert refused_rule.exit_code == 2 and "NotOperator" in refused_rule.output
    assert not store.exists(f"{names.PIPELINES}/access-buoy.yaml")

    monkeypatch.setenv("UPWELL_PRINCIPAL", "bo")
    pushed = cli("payload", "push", str(definition(env, "1.0.0")))
    assert pushed.exit_code == 0 and "registered: column-count@1.0.0" in pushed.output, pushed.output
    meta = store.properties(f"{names.PAYLOADS}/column-count/1.0.0.yaml").metadata
    assert meta["pushed_by"] == "bo"
    assert cli("rules", str(rule)).exit_code == 0 and store.exists(f"{names.PIPELINES}/access-buoy.yaml")
    store.delete(f"{names.PIPELINES}/access-buoy.yaml")  # the session's Azurite is shared: leave no rule behind
    monkeypatch.setenv("UPWELL_PRINCIPAL", "ann")  # nor may a submitter delete what an operator pushed
    refused_delete = cli("payload", "delete", "column-count@1.0.0")
    assert refused_delete.exit_code == 2 and "NotOperator" in refused_delete.output, refused_delete.output
    assert store.exists(f"{names.PAYLOADS}/column-count/1.0.0.yaml")
    monkeypatch.setenv("UPWELL_PRINCIPAL", "bo")

    assert "revoked 1" in cli("access", "revoke", "bo", "--project", "ocean").output
    assert "bo" not in cli("access", "list").output
    again = cli("payload", "push", str(definition(env, "1.0.1")))
    assert again.exit_code == 2 and "NotOperator" in again.output
    assert not store.exists(f"{names.PAYLOADS}/column-count/1.0.1.yaml")
