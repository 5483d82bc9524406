"""The deploy hook that pins the worker images by digest (issue 25 item 6): the parsing of the registry's
answer, recorded as `az acr repository show --image <repo>:<tag> -o json` prints it, and the hook's wiring."""

from __future__ import annotations

import importlib.util
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from upwell.pools import azure_common
from upwell.settings import PoolSpec

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "bicep" / "tools" / "image_digest.py"
DIGEST = "sha256:" + "9f3b" * 16
# The `tag` object of GET /acr/v1/{name}/_tags/{reference} (Tag - Get Properties), as the az CLI prints it.
RECORDED = {"changeableAttributes": {"deleteEnabled": True, "listEnabled": True, "readEnabled": True,
                                     "writeEnabled": True},
            "createdTime": "2026-12-03T09:12:44.1234567Z", "digest": DIGEST,
            "lastUpdateTime": "2026-12-03T09:12:44.1234567Z", "name": "latest", "signed": False}


def _run(image: str, stdin: str, monkeypatch, capsys) -> tuple[int, str, str]:
    """The tool's main, in this process, as the hook runs it: the answer on stdin, the image as argument."""
    spec = importlib.util.spec_from_file_location("image_digest", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = tool.main([image])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("answer", [json.dumps(RECORDED, indent=2),
                                    json.dumps({"registry": "upwelldev.azurecr.io", "imageName": "upwell-mpi",
                                                "tag": RECORDED}),
                                    DIGEST + "\n"])
def test_the_recorded_answer_pins_the_image(answer, monkeypatch, capsys):
    code, out, err = _run("upwelldev.azurecr.io/upwell-mpi", answer, monkeypatch, capsys)
    assert code == 0, err
    assert out.strip() == f"upwelldev.azurecr.io/upwell-mpi@{DIGEST}"
    tagged = _run("upwelldev.azurecr.io/upwell-mpi:latest", answer, monkeypatch, capsys)[1]
    assert tagged.strip() == f"upwelldev.azurecr.io/upwell-mpi@{DIGEST}"


@pytest.mark.parametrize(("answer", "why"), [
    (json.dumps({**RECORDED, "digest": "sha256:" + "0" * 64}), "all-zero digest"),
    (json.dumps({**RECORDED, "digest": "sha256:abc"}), "no sha256 digest"),
    ("", "no sha256 digest"),
])
def test_an_answer_without_a_real_digest_is_refused(answer, why, monkeypatch, capsys):
    code, out, err = _run("upwelldev.azurecr.io/upwell-mpi", answer, monkeypatch, capsys)
    assert code == 3 and why in err and out == ""


def test_the_hook_reads_only_outputs_that_exist_and_postdeploy_runs_it():
    hook = (ROOT / "bicep" / "hooks" / "imagedigest.sh").read_text()
    outputs = set(re.findall(r"^output (\w+) ", (ROOT / "bicep" / "main.bicep").read_text(), re.MULTILINE))
    used = set(re.findall(r"\$\{([A-Z][A-Z0-9_]+):\?", hook))
    assert used and used <= outputs, used - outputs
    assert "az acr repository show --name" in hook and "UPWELL_WORKER_IMAGE_CPU=upwell-mpi" in hook
    assert '"$here/imagedigest.sh"' in (ROOT / "bicep" / "hooks" / "postdeploy.sh").read_text()
    assert (ROOT / "bicep" / "hooks" / "imagedigest.sh").stat().st_mode & 0o111


def test_a_pool_of_a_pinned_image_tells_its_agents_the_digest():
    pinned = PoolSpec(name="cpu", backend="batch", options={"image": f"r.azurecr.io/upwell-mpi@{DIGEST}"})
    assert azure_common.agent_env(pinned)["UPWELL_IMAGE_DIGEST"] == DIGEST
    tagged = PoolSpec(name="cpu", backend="batch", options={"image": "r.azurecr.io/upwell-mpi:latest"})
    assert "UPWELL_IMAGE_DIGEST" not in azure_common.agent_env(tagged)


def test_the_hook_sets_the_pinned_images_and_names_one_not_pushed(tmp_path):
    """The hook with a stand-in `az` that answers as the recorded registry does: upwell-mpi is pushed,
    upwell-gpu is not (az exits 3 with ResourceNotFound, as for a missing tag)."""
    calls = tmp_path / "calls.txt"
    (tmp_path / "az").write_text(f"""#!/bin/sh
echo "$*" >> {calls}
case "$*" in
  *"--image upwell-mpi:v7"*) cat <<'JSON'
{json.dumps(RECORDED)}
JSON
  ;;
  *"--image upwell-gpu:v7"*) echo "ERROR: (ResourceNotFound)" >&2; exit 3 ;;
esac
""")
    (tmp_path / "az").chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "AZURE_RESOURCE_GROUP": "rg-upwell",
           "AZURE_FUNCTION_APP_NAME": "func-upwell", "AZURE_CONTAINER_REGISTRY_NAME": "upwelldev",
           "AZURE_CONTAINER_REGISTRY_ENDPOINT": "upwelldev.azurecr.io", "UPWELL_IMAGE_TAG": "v7"}
    done = subprocess.run(["sh", str(ROOT / "bicep" / "hooks" / "imagedigest.sh")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "upwell-gpu:v7 is not in upwelldev yet" in done.stderr
    set_call = [line for line in calls.read_text().splitlines() if "appsettings set" in line]
    assert set_call == [f"functionapp config appsettings set --only-show-errors --output none --resource-group "
                        f"rg-upwell --name func-upwell --settings UPWELL_WORKER_IMAGE_CPU=upwelldev.azurecr.io/"
                        f"upwell-mpi@{DIGEST}"]
