"""Same argv everywhere: a definition's command runs locally as a process, and the Batch, ACI and
VM Scale Set requests carry its image (pinned by digest) and exactly the same argv.

The local side is real (printf prints each argv element on its own line, so the argv the process
got is read back); the Azure side is the real SDK clients against the recording server.
"""

from __future__ import annotations

import base64
import shlex
import subprocess

import pytest
import yaml

from tests.contract import test_aci_contract as aci
from tests.contract import test_batch_contract as batch
from tests.contract import test_vmss_contract as vmss
from upwell.messages import WorkItem
from upwell.payloads.argv import container_run
from upwell.payloads.params import validate
from upwell.payloads.registry import builtins
from upwell.payloads.validate import load
from upwell.pools import make_pool
from upwell.pools.build_aci import payload_group
from upwell.pools.build_batch import payload_task
from upwell.pools.build_vmss import payload_command
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
    run = container_run(loaded.definition, item, validate(loaded.definition, item.params))
    return loaded, item, run


def test_local_process_gets_the_argv(echo, tmp_path):
    loaded, item, run = echo
    result = run_definition(loaded, item, tmp_path)
    assert result.status == "succeeded", result.stderr_tail
    printed = (tmp_path / "payload.log").read_text().split("\n", 1)[1].splitlines()
    assert printed == run.argv[2:] == [HOSTILE, "--n=3", "{literal}"]
    assert run.argv[:2] == ["printf", "%s\\n"] and run.image == IMAGE


def test_contract_batch_task_carries_image_and_argv(echo, server, credential, client_kwargs):
    _, _, run = echo
    server.route("POST", r"/jobs/job-1/tasks", batch.R(201))
    pool = make_pool(batch.spec(server), credential=credential, client_kwargs=client_kwargs)
    pool.add_task("job-1", payload_task(pool.spec, "s00000-1", run))
    sent = server.calls("POST", r"/jobs/job-1/tasks")[0].body
    assert sent["containerSettings"]["imageName"] == IMAGE
    assert "--workdir /work" in sent["containerSettings"]["containerRunOptions"]
    assert shlex.split(sent["commandLine"]) == run.argv
    assert {"name": "LC_ALL", "value": "C"} in sent["environmentSettings"]


def test_contract_aci_group_carries_image_and_argv(echo, server, credential, client_kwargs):
    _, _, run = echo
    groups = aci.GROUPS + r"/([\w-]+)"
    server.route("PUT", groups, lambda rec, m: (201, aci.group(m[1], prov="Creating", view=False),
                                                {"Azure-AsyncOperation": f"{{base}}/ops/{m[1]}"}))
    server.route("GET", r"/ops/([\w-]+)", aci.R(200, {"status": "Succeeded"}))
    server.route("GET", groups, lambda rec, m: (200, aci.group(m[1]), {}))
    pool = aci.make(credential, client_kwargs, aci.spec("cpu"))
    pool.client.container_groups.begin_create_or_update("rg", "upwell-j1-s00000",
                                                        payload_group(pool.spec, "upwell-j1-s00000", run)).result(10)
    props = server.calls("PUT", groups)[0].body["properties"]
    (container,) = props["containers"]
    assert container["properties"]["image"] == IMAGE
    assert container["properties"]["command"] == run.argv  # a list: no shell, no splitting
    assert props["restartPolicy"] == "Never"
    assert props["imageRegistryCredentials"] == [{"server": "labcr.azurecr.io", "identity": aci.IDENTITY}]


def test_vmss_command_gives_docker_exactly_the_argv(echo):
    _, _, run = echo
    line = payload_command(run)
    # The node's shell runs the line; a stand-in docker prints the arguments it received.
    out = subprocess.run(["sh", "-c", 'docker() { printf "%s\\n" "$@"; }; ' + line], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert out[out.index(IMAGE) + 1:] == run.argv
    assert out[:4] == ["run", "--rm", "-w", "/work"] and "LC_ALL=C" in out


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
