"""Security properties: no commands from manifests, images from the allowlist only, scratch paths
that stay in the work directory, the YAML safe loader, function keys on Azure and loopback locally,
and secrets redacted from every log line."""

from __future__ import annotations

import http.client
import io
import json
import logging
import os
import re
import socket
import subprocess
import sys
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from upwell import documents, logs, names
from upwell.errors import DecodeError, InputRejected
from upwell.ingest import manifests
from upwell.ingest.ingestor import Ingestor
from upwell.local.azurite import ACCOUNT, ACCOUNT_KEY
from upwell.messages import WorkItem, decode, encode
from upwell.settings import Settings
from upwell.storage import Storage

REPO = Path(__file__).resolve().parents[2]
SOURCES = [p for d in ("upwell", "handlers", "workers") for p in (REPO / d).rglob("*.py")] + [REPO / "function_app.py"]


# -- manifests never run commands ------------------------------------------------------------------

@pytest.mark.parametrize("field", ["command", "shell", "entrypoint", "args", "script", "exec", "env"])
def test_a_manifest_cannot_carry_a_command(field):
    doc = {"payload": "logistic", "grid": {"r": [3.1]}, field: "touch /tmp/upwell-owned"}
    with pytest.raises(InputRejected) as err:
        manifests.load_manifest(yaml.safe_dump(doc).encode(), "incoming/x/job.yaml")
    assert err.value.field == field and "Extra inputs are not permitted" in err.value.message


@pytest.mark.parametrize("payload", ["os.system", "subprocess", "/bin/sh", "workers.payloads.logistic", "bash -c id"])
def test_only_registered_payloads(payload):
    with pytest.raises(InputRejected) as err:
        manifests.load_manifest(yaml.safe_dump({"payload": payload}).encode(), "incoming/x/job.yaml")
    assert err.value.field == "payload"


def test_a_work_item_cannot_carry_a_command():
    item = json.loads(encode(WorkItem(job_id="j", shard_id="s", payload="logistic", pool="cpu")))
    with pytest.raises(DecodeError, match="unknown fields"):
        decode(json.dumps({**item, "command": ["sh", "-c", "id"]}))


def test_the_command_line_comes_from_the_registry_only(tmp_path):
    """Parameters reach the payload through item.json, never through its command line."""
    from upwell.payloads import builtin as registry
    from workers.launch import build_command

    hostile = "$(touch /tmp/upwell-owned); `id` && rm -rf / --workdir /etc"
    item = WorkItem(job_id="j", shard_id="s", payload="channel-stats", pool="cpu", params={"time_column": hostile})
    command = build_command(registry.get("channel-stats"), item, tmp_path)
    assert command == [sys.executable, "-m", "workers.payloads.channel_stats", "--workdir", str(tmp_path)]


def test_no_shell_anywhere_in_the_code():
    """No shell=True, os.system or os.popen in what the Function App or a worker runs."""
    pattern = re.compile(r"shell\s*=\s*True|os\.system\(|os\.popen\(|\beval\(|\bexec\(")
    offenders = [f"{p.relative_to(REPO)}:{n}" for p in SOURCES for n, line in enumerate(p.read_text().splitlines(), 1)
                 if pattern.search(line) and not line.lstrip().startswith("#")]
    assert offenders == []


# -- images -----------------------------------------------------------------------------------------

@pytest.fixture
def store(azurite) -> Storage:
    s = Storage(azurite.connection_string)
    s.ensure()
    return s


@pytest.mark.parametrize("image, accepted", [("upwell-mpi", True), ("upwell-gpu", True),
                                             ("docker.io/library/ubuntu:latest", False), ("upwell-mpi:evil", False),
                                             ("attacker.example/upwell-mpi", False)])
def test_images_only_from_the_allowlist(store, image, accepted):
    name = f"sec/image-{abs(hash(image))}/job.yaml"
    store.blob(names.INCOMING, name).upload_blob(yaml.safe_dump(
        {"payload": "heat-mpi", "image": image, "grid": {"nx": [16]}}).encode(), overwrite=True)
    out = Ingestor(store, Settings()).ingest(name)
    assert out.status == ("accepted" if accepted else "rejected"), out
    if not accepted:
        assert "is not on the allowlist" in out.message
    store.queue(names.work_queue("mpi")).clear_messages()


def test_the_allowlist_is_a_setting():
    assert Settings.from_env({"UPWELL_IMAGE_ALLOWLIST": "a, b"}).image_allowlist == ("a", "b")


# -- scratch paths stay inside the work directory ---------------------------------------------------

def _raw_put(azurite, container: str, name: str, data: bytes) -> None:
    """PUT a blob name as is (percent-encoded dots), as a raw REST client could."""
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    sas = generate_container_sas(ACCOUNT, container, account_key=ACCOUNT_KEY,
                                 permission=ContainerSasPermissions(write=True, create=True),
                                 expiry=datetime.now(UTC) + timedelta(minutes=10))
    path = "/".join({"..": "%2E%2E", ".": "%2E"}.get(p, p) for p in name.split("/"))
    conn = http.client.HTTPConnection("127.0.0.1", azurite.blob_port, timeout=30)
    conn.request("PUT", f"/{ACCOUNT}/{container}/{path}?{sas}", body=data,
                 headers={"x-ms-blob-type": "BlockBlob", "x-ms-version": "2021-08-06"})
    assert conn.getresponse().status == 201


def _agent(store: Storage, scratch: Path):
    from workers.agent import Agent, AgentConfig

    return Agent(store, AgentConfig(pool="cpu", scratch=str(scratch), node_id="sec"), Settings())


def test_checkpoint_names_cannot_escape_the_work_dir(store, azurite, tmp_path):
    """Hostile blob names under a shard's checkpoint prefix are refused when staging in."""
    from upwell.storage import DotSegments

    job = f"sec-{os.getpid()}"
    prefix = f"{job}/s00001/"
    outside = tmp_path / "outside"
    outside.mkdir()
    store.write(f"{names.CHECKPOINTS}/{prefix}state/ok.bin", b"fine")
    store.write(f"{names.CHECKPOINTS}/{prefix}{outside}/absolute", b"owned")  # prefix + "/tmp/..."
    store.write(f"{names.CHECKPOINTS}/{prefix}a\\..\\..\\..\\backslash", b"owned")  # stored with '/' and '..'
    store.write(f"{names.CHECKPOINTS}/{prefix}tab\there", b"owned")
    _raw_put(azurite, names.CHECKPOINTS, f"{prefix}../../dotdot", b"owned")
    stored = [b.name for b in store.list(names.CHECKPOINTS, prefix)]
    assert any(".." in n.split("/") for n in stored) and any("//" in n for n in stored)
    item = WorkItem(job_id=job, shard_id="s00001", payload="logistic", pool="cpu",
                    checkpoint_prefix=f"{names.CHECKPOINTS}/{prefix}")
    root = tmp_path / "work"
    root.mkdir()
    try:
        resume = _agent(store, tmp_path / "scratch").staging.checkpoint_in(item, root)
        staged = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
        assert staged == ["resume/state/ok.bin"] and (resume / "state" / "ok.bin").read_bytes() == b"fine"
        assert list(outside.rglob("*")) == [] and not (tmp_path / "dotdot").exists()
        assert not (tmp_path / "backslash").exists() and not Path("/absolute").exists()
    finally:
        from azure.storage.blob import BlobClient

        svc = store.blobs
        for n in stored:
            BlobClient(svc.url, names.CHECKPOINTS, n, credential=svc.credential, transport=DotSegments()).delete_blob()


def test_artifact_and_checkpoint_names_are_made_safe(store, tmp_path):
    """Artifacts and checkpoint files are staged out under safe names; links are not followed."""
    job = f"sec-art-{os.getpid()}"
    item = WorkItem(job_id=job, shard_id="s00001", payload="logistic", pool="cpu",
                    checkpoint_prefix=f"{names.CHECKPOINTS}/{job}/s00001/",
                    result_prefix=f"{names.RESULTS}/{job}/s00001")
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    out.mkdir()
    ckpt.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("do not upload")
    hostile = ["..\\..\\..\\reports\\evil.html", "tab\tname.txt", "plain.csv", "..", "%2E%2E"]
    files = []
    for n in hostile:
        if n == "..":
            continue
        (out / n).write_bytes(b"x")
        (ckpt / n).write_bytes(b"x")
        files.append(out / n)
    (out / "link.txt").symlink_to(secret)
    (ckpt / "link.txt").symlink_to(secret)
    files.append(out / "link.txt")
    agent = _agent(store, tmp_path / "scratch")
    (out / "linked-dir").symlink_to(tmp_path)  # a file reached through a linked folder is outside out/
    files.append(out / "linked-dir" / "secret.txt")
    staged = agent.staging.stage_out(item, files, out)
    agent.staging.checkpoint_out(item, ckpt)
    written = [b.name for b in store.list(names.RESULTS, f"{job}/")] + \
        [b.name for b in store.list(names.CHECKPOINTS, f"{job}/")]
    assert "link.txt" not in staged and "secret.txt" not in staged and not any("link" in n for n in written)
    for n in written:
        parts = n.split("/")
        assert parts[:2] == [job, "s00001"] and len(parts) == 3, n
        assert ".." not in parts and "\t" not in n and "\\" not in n, n
    assert sorted(staged) == sorted([".._.._.._reports_evil.html", "tab_name.txt", "plain.csv", "_2E_2E"])


@pytest.mark.parametrize("name", ["..", ".", "a/b", "a\\b", "x\x00y", "line\nbreak", "é" * 300])
def test_safe_name_is_one_harmless_segment(name):
    from workers.staging import safe_name

    safe = safe_name(name)
    assert safe not in (".", "..", "") and "/" not in safe and "\\" not in safe and safe.isprintable()
    assert len(safe) <= 200


def test_the_scratch_folder_is_created(tmp_path):
    """A node whose scratch folder is missing still runs shards (it used to fail, then poison, every one)."""
    from workers.agent import Agent, AgentConfig

    scratch = tmp_path / "not" / "there"
    Agent(Storage("DefaultEndpointsProtocol=http;AccountName=a;AccountKey=a2V5;BlobEndpoint=http://127.0.0.1:1/a;"
                  "QueueEndpoint=http://127.0.0.1:1/a;TableEndpoint=http://127.0.0.1:1/a;"),
          AgentConfig(pool="cpu", scratch=str(scratch)), Settings())
    assert scratch.is_dir()


# -- YAML: the safe loader only ---------------------------------------------------------------------

@pytest.mark.parametrize("doc", [
    "payload: !!python/object/apply:os.system ['touch {marker}']\n",
    "payload: !!python/object/new:subprocess.Popen [['touch', '{marker}']]\n",
    "payload: !!python/name:os.system\n",
    "!!python/object:__main__.X {{}}\n",
])
def test_yaml_python_tags_are_refused(doc, tmp_path):
    marker = tmp_path / "owned"
    with pytest.raises(InputRejected) as err:
        documents.parse_document(doc.format(marker=marker).encode(), "incoming/x/job.yaml")
    assert err.value.field == "document" and "constructor" in err.value.message
    assert not marker.exists()


def test_no_unsafe_yaml_loader_in_the_code():
    pattern = re.compile(r"yaml\.(unsafe_load|full_load|load_all)\(|FullLoader|UnsafeLoader|yaml\.Loader\b|"
                         r"yaml\.load\((?![^)]*Loader=_SafeLoader)")
    offenders = [f"{p.relative_to(REPO)}:{n}" for p in SOURCES for n, line in enumerate(p.read_text().splitlines(), 1)
                 if pattern.search(line)]
    assert offenders == []


# -- HTTP: function keys on Azure, loopback locally ----------------------------------------------------

def test_http_functions_require_a_function_key():
    """The bindings the Functions host reads: authLevel FUNCTION on every HTTP trigger."""
    from upwell.local.devhost.app import load_functions

    http = [s for s in load_functions("function_app:app") if s.trigger_type == "httpTrigger"]
    assert http and {s.name: s.trigger["authLevel"] for s in http} == {s.name: "FUNCTION" for s in http}


def _addresses() -> list[str]:
    """This machine's other IPv4 addresses, and always 127.0.0.2: a socket bound to 127.0.0.1 does not
    answer there, one bound to every interface does, so the list is never empty (a container may have no
    address but loopback)."""
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=5).stdout.split()
    except OSError:
        out = []
    return [a for a in out if ":" not in a and not a.startswith("127.")] + ["127.0.0.2"]


def _answers(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=2).close()
    except OSError:
        return False
    return True


def test_a_server_on_every_interface_answers_on_the_probed_addresses():
    """The control for the loopback test below: the probe does see a server bound to 0.0.0.0."""
    with socket.create_server(("0.0.0.0", 0)) as server:  # every interface on purpose; closed at once
        port = server.getsockname()[1]
        assert {a: _answers(a, port) for a in _addresses()} == dict.fromkeys(_addresses(), True)


def test_the_devhost_listens_on_loopback_only():
    from upwell.local.devhost import DevHost

    host = DevHost("function_app:app", connection_string="UseDevelopmentStorage=true", port=0,
                   host_json=REPO / "host.json", functions=["jobs", "job"])
    host.start()
    try:
        address, port = host.http.address
        assert address == "127.0.0.1"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/host/status", timeout=10) as r:
            assert json.loads(r.read()) == {"state": "Running"}
        # the machine's other addresses do not answer (the test above shows that they would, bound wider)
        assert {a: _answers(a, port) for a in _addresses()} == dict.fromkeys(_addresses(), False)
    finally:
        host.stop()


# -- secrets never reach a log line ----------------------------------------------------------------

def test_secrets_are_redacted_from_every_log_line(azurite, monkeypatch):
    """A structlog line and a stdlib line that carry the Azurite connection string, a SAS URL, nested
    config and an exception: the account key and the signature never appear."""
    from azure.storage.blob import BlobSasPermissions, generate_blob_sas

    sas = generate_blob_sas(ACCOUNT, "results", "j/s.json", account_key=ACCOUNT_KEY,
                            permission=BlobSasPermissions(read=True), expiry=datetime.now(UTC) + timedelta(hours=1))
    signature = re.search(r"sig=([^&]+)", sas)[1]
    url = f"http://127.0.0.1:{azurite.blob_port}/{ACCOUNT}/results/j/s.json?{sas}"
    conn = azurite.connection_string
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    stdlib = logging.getLogger("azure.core.upwell-test")
    stdlib.addHandler(handler)
    monkeypatch.setattr(sys, "stderr", out)
    logs.configure(pretty=False)  # binds the renderer to the current stderr
    try:
        log = logs.get("upwell.test", connection=conn)
        log.info(f"connecting with {conn}", url=url, config={"storage": {"conn": conn, "account_key": ACCOUNT_KEY}},
                 urls=[url, url], key=ACCOUNT_KEY)
        try:
            raise RuntimeError(f"cannot reach {url} with {conn}")
        except RuntimeError:
            log.exception("failed", error=RuntimeError(conn))
        stdlib.warning("request %s failed (%s)", url, conn)
    finally:
        stdlib.removeHandler(handler)
        monkeypatch.undo()
        logs.configure(pretty=False)
    text = out.getvalue()
    events = [json.loads(ln) for ln in text.splitlines() if ln.startswith("{")]
    assert [e["event"][:15] for e in events] == ["connecting with", "failed"]
    assert "Traceback" in events[1]["exception"] and "request http://" in text
    assert "AccountKey=***" in text and "sig=***" in text
    for secret in (ACCOUNT_KEY, ACCOUNT_KEY[:20], signature):
        assert secret not in text, f"{secret[:12]}... leaked into the log"
