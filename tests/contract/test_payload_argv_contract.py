"""Same argv everywhere: a definition's command runs as a process with exactly its argv, and a pool for
the definition runs its image (pinned by digest) with the agent inside, which runs that same argv there.

The local side is real (printf prints each argv element on its own line, so the argv the process
got is read back); the Azure side is the pool's own ``scale_to`` with the real SDK clients against the
recording server.
"""

from __future__ import annotations

import base64

import pytest
import yaml

from tests.contract import test_vmss_contract as vmss
from upwell.messages import WorkItem
from upwell.payloads.registry import builtins
from upwell.payloads.validate import load
from workers.runner import run_definition

IMAGE = "labcr.azurecr.io/tools/echo@sha256:" + "7a" * 32
HOSTILE = "a b; rm -rf / $(id) `id` | cat > /etc/x 'q' \"d\""
DEFINITION = {"schema": 1, "name": "argv-echo", "version": "1.0.0", "owner": "test", "image": IMAGE,
              "command": ["printf", "%s\\n", "{label}", "--n={n}", "{{literal}}"],
              "params": {"label": {"type": "str", "default": "x"}, "n": {"type": "int", "default": 3}},
              "env": {"LC_ALL": "C"}}


@pytest.fixture(scope="module")
def echo():
    loaded = load(yaml.safe_dump(DEFINITION).encode(), "argv-echo.yaml", ("*.azurecr.io",))
    item = WorkItem(job_id="j1", shard_id="s00000", payload="argv-echo", pool="cpu", params={"label": HOSTILE})
    return loaded, item


def test_local_process_gets_the_argv(echo, tmp_path):
    loaded, item = echo
    result = run_definition(loaded, item, tmp_path)
    assert result.status == "succeeded", result.stderr_tail
    printed = (tmp_path / "payload.log").read_text().split("\n", 1)[1].splitlines()
    assert printed == [HOSTILE, "--n=3", "{literal}"]  # each element whole: no shell split or expanded it


def test_contract_pools_for_a_definition_run_its_image(server, credential, client_kwargs):
    """A pool with options.payload runs the definition's image (the agent inside runs the argv)."""
    image = builtins()["gromacs-md"].definition.image
    for name in ("upwell-cpu", "upwell-cpu-spot"):
        server.route("GET", rf"{vmss.SETS}/{name}", vmss.A("ResourceNotFound", "no", 404),
                     vmss.R(200, vmss.vmss_json(name, 1)))
        server.route("GET", rf"{vmss.SETS}/{name}/virtualMachines", vmss.R(200, {"value": []}))
        server.route("PUT", rf"{vmss.SETS}/{name}", vmss.R(201, vmss.vmss_json(name, 0),
                                                          {"Azure-AsyncOperation": f"{{base}}/ops/{name}"}))
        server.route("GET", rf"/ops/{name}", vmss.R(200, {"status": "Succeeded"}))
    pool = vmss.make(server, credential, client_kwargs, vmss.spec(share=0.0, payload="gromacs-md"))
    pool.scale_to(1)
    for p in pool.pollers:
        p.result(timeout=10)
    body = server.calls("PUT", rf"{vmss.SETS}/upwell-cpu")[0].body
    init = base64.b64decode(body["properties"]["virtualMachineProfile"]["osProfile"]["customData"]).decode()
    assert f"{image} python -m workers.agent --pool cpu" in init and "@sha256:" in image
