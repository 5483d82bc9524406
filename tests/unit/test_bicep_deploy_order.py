"""The Event Grid subscriptions are created only after the code (and so the
Functions blobs_extension key) exists.

main.bicep must never deploy events.bicep (a provision into an empty resource
group would then try to create the webhook subscription before the key exists),
and bicep/hooks/postdeploy.sh must deploy it only once every blob-triggered
function is listed and the key exists. The hook runs here for real under `sh`,
with `az` and `curl` replaced by recording stand-ins on PATH.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "bicep" / "hooks" / "postdeploy.sh"
TRIGGERS = [{"function": "ingest", "container": "incoming"}, {"function": "collect", "container": "results"}]

FAKE_AZ = r"""#!/bin/sh
# Records every call; answers from the state files the test writes.
printf '%s\n' "$*" >> "$FAKE_DIR/calls"
case "$1 $2 $3" in
  "functionapp function list") cat "$FAKE_DIR/listed" 2>/dev/null; exit 0 ;;
  "functionapp keys list")
    case "$*" in
      *"systemKeys.blobs_extension != null"*) cat "$FAKE_DIR/has_key" 2>/dev/null || echo false; exit 0 ;;
      *"systemKeys.eventgrid_extension != null"*)
        cat "$FAKE_DIR/has_eg_key" 2>/dev/null || cat "$FAKE_DIR/has_key" 2>/dev/null || echo false; exit 0 ;;
      *) echo "the hook must not read the key itself" >&2; exit 3 ;;
    esac ;;
  "deployment group create") exit "$(cat "$FAKE_DIR/deploy_rc" 2>/dev/null || echo 0)" ;;
esac
echo "unexpected az call: $*" >&2
exit 2
"""


def _env(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("az", FAKE_AZ), ("curl", "#!/bin/sh\nexit 0\n")):
        tool = bin_dir / name
        tool.write_text(text)
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_DIR": str(tmp_path),
        "AZURE_RESOURCE_GROUP": "rg-upwell-t",
        "AZURE_FUNCTION_APP_NAME": "func-upwell-t",
        "AZURE_FUNCTION_APP_HOST": "func-upwell-t.azurewebsites.net",
        "AZURE_STORAGE_ACCOUNT": "stupwt",
        "EVENTGRID_SYSTEM_TOPIC_NAME": "evgt-upwell-t",
        "EVENTGRID_DEADLETTER_CONTAINER": "eventgrid-deadletter",
        "UPWELL_BLOB_TRIGGERS": json.dumps(TRIGGERS),
        "UPWELL_POSTDEPLOY_ATTEMPTS": "3",
        "UPWELL_POSTDEPLOY_WAIT_S": "0",
    }


def _run(tmp_path: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, list[str]]:
    proc = subprocess.run(["sh", str(HOOK)], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    calls_file = tmp_path / "calls"
    calls = calls_file.read_text().splitlines() if calls_file.exists() else []
    return proc, calls


def _deploys(calls: list[str]) -> list[str]:
    return [c for c in calls if c.startswith("deployment group create")]


def test_main_template_never_deploys_the_event_subscriptions():
    main = (ROOT / "bicep" / "main.bicep").read_text()
    code = "\n".join(line for line in main.splitlines() if not line.strip().startswith("//"))
    assert "events.bicep" not in code
    assert "eventSubscriptions" not in code
    assert "enableEventSubscriptions" not in code
    params = json.loads((ROOT / "bicep" / "main.parameters.json").read_text())["parameters"]
    assert "enableEventSubscriptions" not in params
    # No other template creates the subscriptions either.
    for path in (ROOT / "bicep").rglob("*.bicep"):
        if path.name != "events.bicep":
            assert "Microsoft.EventGrid/systemTopics/eventSubscriptions" not in path.read_text(), path
    assert "ENABLE_EVENT_SUBSCRIPTIONS" not in HOOK.read_text()


def test_hook_waits_while_the_functions_are_not_listed(tmp_path):
    env = _env(tmp_path)
    (tmp_path / "listed").write_text("func-upwell-t/scale\n")
    (tmp_path / "has_key").write_text("true\n")
    proc, calls = _run(tmp_path, env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert _deploys(calls) == []
    assert "ingest is not listed yet" in proc.stdout
    assert len([c for c in calls if c.startswith("functionapp function list")]) == 3


def test_hook_waits_for_the_blobs_extension_key(tmp_path):
    env = _env(tmp_path)
    (tmp_path / "listed").write_text("func-upwell-t/ingest\nfunc-upwell-t/collect\nfunc-upwell-t/scale\n")
    (tmp_path / "has_key").write_text("false\n")
    proc, calls = _run(tmp_path, env)
    assert proc.returncode == 1
    assert _deploys(calls) == []
    assert "blobs_extension key does not exist yet" in proc.stdout


def test_hook_waits_for_the_eventgrid_extension_key(tmp_path):
    """collect is an Event Grid trigger: its subscription's endpoint carries the eventgrid_extension key."""
    env = _env(tmp_path)
    (tmp_path / "listed").write_text("func-upwell-t/ingest\nfunc-upwell-t/collect\n")
    (tmp_path / "has_key").write_text("true\n")
    (tmp_path / "has_eg_key").write_text("false\n")
    proc, calls = _run(tmp_path, env)
    assert proc.returncode == 1
    assert _deploys(calls) == []
    assert "eventgrid_extension key does not exist yet" in proc.stdout


def test_hook_deploys_once_the_code_and_key_exist(tmp_path):
    env = _env(tmp_path)
    (tmp_path / "listed").write_text("func-upwell-t/ingest\nfunc-upwell-t/collect\n")
    (tmp_path / "has_key").write_text("true\n")
    proc, calls = _run(tmp_path, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    deploys = _deploys(calls)
    assert len(deploys) == 1
    assert "modules/events.bicep" in deploys[0]
    assert re.search(r"blobTriggers=\[\{\"function\": \"ingest\"", deploys[0])
    # The key was only asked about, never read.
    assert not any(c.startswith("functionapp keys list") and "!= null" not in c for c in calls)


def test_hook_retries_a_failed_deployment(tmp_path):
    env = _env(tmp_path)
    (tmp_path / "listed").write_text("func-upwell-t/ingest\nfunc-upwell-t/collect\n")
    (tmp_path / "has_key").write_text("true\n")
    (tmp_path / "deploy_rc").write_text("1\n")
    proc, calls = _run(tmp_path, env)
    assert proc.returncode == 1
    assert len(_deploys(calls)) == 3
    assert "could not be created" in proc.stderr


@pytest.mark.parametrize("triggers", ["[]", "not json"])
def test_hook_refuses_triggers_without_functions(tmp_path, triggers):
    env = _env(tmp_path)
    env["UPWELL_BLOB_TRIGGERS"] = triggers
    proc, calls = _run(tmp_path, env)
    assert proc.returncode == 1
    assert calls == []


def test_blob_group_scales_from_zero_unless_always_ready_is_asked_for():
    """Flex Consumption needs no always-ready instance for Event Grid blob triggers (docs/deploy.md cites the
    plan's documentation); the option exists, defaults to 0, and reaches the `blob` group's alwaysReady entry."""
    app = (ROOT / "bicep" / "modules" / "functionapp.bicep").read_text()
    assert re.search(r"param blobAlwaysReady int = 0\b", app)
    assert re.search(r"alwaysReady: blobAlwaysReady > 0 \? \[\s*\{\s*name: 'blob'\s*instanceCount: blobAlwaysReady",
                     app)
    main = (ROOT / "bicep" / "main.bicep").read_text()
    assert re.search(r"param functionBlobAlwaysReady int = 0\b", main)
    assert "blobAlwaysReady: functionBlobAlwaysReady" in main
    params = json.loads((ROOT / "bicep" / "main.parameters.json").read_text())["parameters"]
    assert params["functionBlobAlwaysReady"]["value"] == "${UPWELL_BLOB_ALWAYS_READY=0}"
    docs = (ROOT / "docs" / "deploy.md").read_text()
    assert "learn.microsoft.com/azure/azure-functions/flex-consumption-plan" in docs
    assert "UPWELL_BLOB_ALWAYS_READY" in docs
