"""What the code reads is what the templates create and set.

upwell/names.py holds the storage, connection and app-setting names; the
handlers hold the blob triggers; upwell.pools builds the agent's environment.
bicep/ must create and set exactly those (parsed with pycep in .venv-iac, then
compared here). A second test scans templates and code for key material:
account keys, SAS tokens and key-listing calls.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from upwell import names
from upwell.pools import azure_common
from upwell.pools.base import PoolSpec

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bicep" / "tools"))

import upwell_iac as iac  # noqa: E402

# The only key allowed anywhere: Azurite's published development key.
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
# Blob-triggered functions and the container each watches (DESIGN.md "The flow").
BLOB_TRIGGERS = {"ingest": names.INCOMING, "collect": names.RESULTS}
WEBHOOKS = {"ingest": "blobs", "collect": "eventgrid"}  # a blob trigger; an Event Grid trigger
CONNECTION_KEYS = {"blobServiceUri", "queueServiceUri", "tableServiceUri", "credential", "clientId"}


@pytest.fixture(scope="module")
def trees() -> dict[str, dict]:
    try:
        return iac.bicep_json()
    except iac.IacVenvMissing as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="module")
def main_vars(trees) -> dict:
    return {k: v["value"] for k, v in trees["bicep/main.bicep"]["variables"].items()}


def _keys(expr, variables: dict) -> set[str]:
    """Keys of an object literal, a variable naming one, or union(...) of those."""
    if isinstance(expr, str) and expr in variables:
        return _keys(variables[expr], variables)
    if isinstance(expr, dict) and set(expr) == {"function"} and expr["function"]["type"] == "union":
        return set().union(*(_keys(a, variables) for a in expr["function"]["parameters"].values()))
    if isinstance(expr, dict) and not ({"function", "operator"} & set(expr)):
        return set(expr)
    raise AssertionError(f"cannot read the keys of {expr!r}")


def _pool_vars(main_vars: dict) -> dict[str, dict]:
    """The UPWELL_POOLS entries: every variable shaped like a PoolSpec (it has a backend)."""
    return {k: v for k, v in main_vars.items() if isinstance(v, dict) and "backend" in v}


# ---------------------------------------------------------------- storage


def test_containers(main_vars):
    assert main_vars["containerNames"] == list(names.CONTAINERS)


def test_infrastructure_containers_are_apart(trees, main_vars):
    storage = trees["bicep/main.bicep"]["modules"]["storage"]["config"]["params"]
    infra = [main_vars.get(v, v) for v in storage["infraContainerNames"]]
    assert infra == ["app-package", "eventgrid-deadletter"]
    assert not set(infra) & set(names.CONTAINERS)
    # The Functions host creates its own (receipts, keys); the templates must not take its names.
    assert names.HOST_RECEIPTS not in set(infra) | set(main_vars["containerNames"])


def test_queues_each_with_a_poison_twin(main_vars):
    queues = main_vars["queueNames"]
    assert len(queues) == len(set(queues))
    assert set(queues) == set(names.ALL_QUEUES)
    for q in names.QUEUES:
        assert names.poison_queue(q) in queues
    assert names.BLOB_POISON_QUEUE not in queues  # the host makes its own


def test_tables(main_vars):
    assert main_vars["tableNames"] == list(names.TABLES)


def test_storage_module_creates_what_main_passes(trees):
    params = trees["bicep/main.bicep"]["modules"]["storage"]["config"]["params"]
    assert (params["containerNames"], params["queueNames"], params["tableNames"]) == \
        ("containerNames", "queueNames", "tableNames")
    resources = trees["bicep/modules/storage.bicep"]["resources"]
    loops = {r["type"].rsplit("/", 1)[-1]: r["config"]["loop_type"]["detail"]["array_name"]
             for r in resources.values() if "loop_type" in r["config"]}
    assert loops["queues"] == "queueNames" and loops["tables"] == "tableNames"


# ---------------------------------------------------------------- the Function App


def test_app_settings(main_vars):
    settings = main_vars["functionAppSettings"]
    missing = set(names.APP_SETTINGS) - set(settings)
    assert not missing, f"the code reads {missing}; main.bicep does not set them"
    unknown = {k for k in settings if k.startswith("UPWELL_")} - set(names.APP_SETTINGS)
    assert not unknown, f"main.bicep sets {unknown}; add them to upwell/names.py APP_SETTINGS or drop them"


def test_identity_based_connection(main_vars):
    settings = main_vars["functionAppSettings"]
    assert names.CONNECTION not in settings, "no connection string: the connection is identity based"
    prefix = f"{names.CONNECTION}__"
    conn = {k.removeprefix(prefix) for k in settings if k.startswith(prefix)}
    assert conn == CONNECTION_KEYS
    assert settings[f"{prefix}credential"] == "managedidentity"
    assert settings["APPLICATIONINSIGHTS_AUTHENTICATION_STRING"].startswith("Authorization=AAD;ClientId=")
    assert not any("ConnectionString" in k or k.endswith("_KEY") for k in settings)


def test_upwell_pools_match_poolspec(main_vars):
    pools = main_vars["upwellPools"]
    assert set(pools) == set(names.POOLS)
    known = {f.name for f in fields(PoolSpec)} - {"name"}
    specs = _pool_vars(main_vars)
    assert {"cpuPoolBatch", "cpuPoolVmss", "cpuPoolAci", "mpiPool", "gpuPool"} <= set(specs)
    required = {"batch": {"image", "account_url", "account_name", "subscription_id", "resource_group", "pool_id"},
                "vmss": {"image", "subscription_id", "resource_group", "location", "subnet_id", "ssh_public_key",
                         "scale_set"},
                "aci": {"image", "subscription_id", "resource_group", "location"}}
    for var, spec in specs.items():
        assert set(spec) <= known, f"{var}: {set(spec) - known} are not PoolSpec fields"
        options = _keys(spec["options"], main_vars)
        assert required[spec["backend"]] <= options, f"{var}: options lack {required[spec['backend']] - options}"
        assert {"identity_id", "identity_client_id", "storage_account", "registry", "tags"} <= options


def test_batch_pools_are_the_upwell_pools(main_vars):
    batch_pools = {main_vars[v]["pool"]: main_vars[v]["id"] for v in ("cpuBatchPool", "mpiBatchPool", "gpuBatchPool")}
    assert set(batch_pools) == set(names.POOLS)
    # upwell.pools.build_batch names a pool upwell-<pool> unless options.pool_id says otherwise.
    assert all(pool_id == f"upwell-{pool}" for pool, pool_id in batch_pools.items())


def test_agent_environment_matches_the_code(trees):
    """Batch start task and scale-set boot script give the agent what upwell.pools gives it."""
    spec = PoolSpec("cpu", backend="batch", vm_size="Standard_D4s_v5",
                    options={"identity_client_id": "x", "storage_account": "y", "image": "r.azurecr.io/i"})
    # Both Azure boot paths (Batch, scale set) also turn on the agent's Scheduled Events watcher.
    expected = set(azure_common.agent_env(spec, **azure_common.AZURE_VM_ENV))
    assert "UPWELL_EVICTION_WATCH" in expected
    pool = trees["bicep/modules/batch.bicep"]["resources"]["batchPools"]["config"]["config"]["properties"]
    # `startTask: p.gangs ? null : {...}`: a gang pool's agents are Batch tasks (upwell.pools.build_batch_tasks)
    start = pool["startTask"]["operator"]["operands"]["operand_2"]["operator"]["operands"]["false_value"]
    # Batch's start task adds the image's scratch folder (build_batch.start_task) to the common environment.
    from upwell.pools import build_batch
    assert {e["name"] for e in build_batch.start_task(spec)["environmentSettings"]} == expected | {"UPWELL_SCRATCH"}
    assert {e["name"] for e in start["environmentSettings"]} == expected | {"UPWELL_SCRATCH"}
    # Both run the agent as the image's user (uid/gid), as build_batch.user_account declares it.
    assert start["userIdentity"] == {"userName": build_batch.AGENT_USER}
    account = pool["userAccounts"][0]
    assert account["name"] == build_batch.AGENT_USER
    assert account["linuxUserConfiguration"] == {"uid": build_batch.IMAGE_UID, "gid": build_batch.IMAGE_GID}
    command = " ".join(azure_common.agent_command(spec)[:-1])
    assert command + " ${p.pool}" in start["commandLine"]
    cloud_init = (ROOT / "bicep" / "modules" / "vmss-cloud-init.yaml").read_text()
    env_file = cloud_init.split("path: /etc/upwell/agent.env", 1)[1].split("- path:", 1)[0]
    assert set(re.findall(r"^\s+([A-Za-z_]+)=", env_file, re.M)) == expected
    assert command + " __POOL__" in cloud_init
    assert "scheduledevents" not in cloud_init  # no shell watcher that stops the agent for another VM's event


# ---------------------------------------------------------------- Event Grid -> blob triggers


def test_event_subscriptions_cover_the_blob_triggers(trees, main_vars):
    triggers = {t["function"]: t["container"] for t in main_vars["blobTriggers"]}
    assert triggers == BLOB_TRIGGERS
    events = trees["bicep/modules/events.bicep"]["resources"]["subscriptions"]["config"]
    body = events["config"]["properties"]
    assert events["loop_type"]["detail"]["array_name"] == "blobTriggers"
    assert body["filter"]["includedEventTypes"] == ["Microsoft.Storage.BlobCreated"]
    assert body["filter"]["subjectBeginsWith"] == "/blobServices/default/containers/${t.container}/"
    # collect's subscription delivers only result JSON, not the artifacts a shard writes (issue 23).
    assert body["filter"]["subjectEndsWith"] == {"operator": {"type": "property_accessor", "operands": {
        "operand_1": "t", "operand_2": "subjectEndsWith"}}}
    suffixes = {t["function"]: t["subjectEndsWith"] for t in main_vars["blobTriggers"]}
    assert suffixes == {"ingest": "", "collect": ".json"}
    url = json.dumps(body["destination"]["properties"]["endpointUrl"])
    # A blob trigger's endpoint is the blobs extension webhook, an Event Grid trigger's the Event Grid one.
    assert "${blobsEndpoint}?functionName=Host.Functions.${t.function}&code=${systemKeys.blobs_extension}" in url
    assert "${eventGridEndpoint}?functionName=${t.function}&code=${systemKeys.eventgrid_extension}" in url
    assert {t["function"]: t["webhook"] for t in main_vars["blobTriggers"]} == WEBHOOKS


def test_function_app_blob_triggers_match():
    """The registered functions: the same names and containers, a blob trigger with its path, connection and
    Event Grid source where main.bicep says `webhook: 'blobs'`, an Event Grid trigger where it says 'eventgrid'."""
    import function_app
    from upwell.local.devhost.app import load_functions

    # load_functions caches per app: FunctionApp.get_functions() may run only once per app, and
    # the devhost tests (and the fault suite) have usually loaded this app already.
    specs = {s.name: s for s in load_functions(function_app.app)}
    kinds = {"blobs": "blobTrigger", "eventgrid": "eventGridTrigger"}
    assert {name: specs[name].trigger_type for name in BLOB_TRIGGERS} == {n: kinds[w] for n, w in WEBHOOKS.items()}
    for name, container in BLOB_TRIGGERS.items():
        if WEBHOOKS[name] == "blobs":
            trigger = specs[name].trigger
            assert trigger["path"] == f"{container}/{{name}}"
            assert trigger["connection"] == names.CONNECTION
            assert trigger["source"] == "EventGrid"


# ---------------------------------------------------------------- no keys anywhere

TEXT_SUFFIXES = {".py", ".bicep", ".json", ".yaml", ".yml", ".md", ".sh", ".toml", ".txt", ".cfg", ".ini",
                 ".mk", ".j2", ".html", ".env", ".ps1", ".http"}
TEXT_NAMES = {"Makefile", ".funcignore", ".gitignore", "Dockerfile"}

ACCOUNT_KEY = re.compile(r"AccountKey\s*=\s*([^;\"'\s<>{}$]*)")
LITERAL_SAS = re.compile(r"SharedAccessSignature\s*=\s*[^;\"'\s<>{}$]{10,}")
SAS_SIGNATURE = re.compile(r"[?&]sig=[A-Za-z0-9%+/=]{10,}")
KEY_SHAPE = re.compile(r"(?<![A-Za-z0-9+/-])[A-Za-z0-9+/]{86}==")
BICEP_LIST = re.compile(r"\blist(Keys|AccountSas|ServiceSas|ConnectionStrings?)\s*\(([^)]*)")
PY_KEY_CALLS = re.compile(r"\.(list_keys|regenerate_key)\s*\(|\bgenerate_account_sas\s*\(")


def _repo_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split("\n")
    files = []
    for rel in filter(None, out):
        path = ROOT / rel
        if path.is_file() and (path.suffix in TEXT_SUFFIXES or path.name in TEXT_NAMES
                               or path.name.startswith("Dockerfile")):
            files.append(path)
    return files


def _violations(path: Path, text: str) -> list[str]:
    """What the file holds that looks like key material or a call that lists keys; one check per kind."""
    found = _account_keys(text) + _sas(text) + _key_shapes(text)
    if path.suffix == ".bicep":
        found += _bicep_key_lists(text)
    if path.suffix == ".py" and PY_KEY_CALLS.search(text):
        found.append("a call that lists or uses account keys")
    return found


def _account_keys(text: str) -> list[str]:
    return ["an account key (AccountKey=...)" for m in ACCOUNT_KEY.finditer(text)
            if len(m.group(1)) >= 20 and m.group(1) != AZURITE_KEY]


def _sas(text: str) -> list[str]:
    found = []
    if LITERAL_SAS.search(text):
        found.append("a SAS token (a SharedAccessSignature field)")
    if SAS_SIGNATURE.search(text):
        found.append("a SAS signature (sig=...)")
    return found


def _key_shapes(text: str) -> list[str]:
    return ["a storage-key-shaped secret" for m in KEY_SHAPE.finditer(text)
            if m.group(0) != AZURITE_KEY and not text[max(0, m.start() - 7):m.start()].startswith("sha")]


def _bicep_key_lists(text: str) -> list[str]:
    # The one documented exception: the Functions host's system key for the blobs
    # extension webhook (events.bicep), read by ARM at deploy time; not a storage key.
    return [f"list{m.group(1)}({m.group(2)[:40]}...)" for m in BICEP_LIST.finditer(text)
            if not (m.group(1) == "Keys" and "/host/default" in m.group(2))]


def test_no_keys_connection_strings_or_sas_in_templates_and_code():
    files = _repo_text_files()
    assert any(p.suffix == ".bicep" for p in files) and any(p.suffix == ".py" for p in files)
    bad = {}
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if hits := _violations(path, text):
            bad[str(path.relative_to(ROOT))] = sorted(set(hits))
    assert not bad, f"key material or key-listing calls: {bad}"


def test_the_key_scan_catches_keys():
    fake = "Q" * 86 + "=="
    assert _violations(Path("x.py"), f"DefaultEndpointsProtocol=https;AccountName=a;AccountKey={fake};")
    assert _violations(Path("x.md"), "https://a.blob.core.windows.net/c/b?sv=2024-01-01&" + "sig=abcdefghijklmnop")
    assert _violations(Path("x.bicep"), "var k = storage.listKeys().keys[0].value")
    assert _violations(Path("x.bicep"), "var k = listKeys(storage.id, '2023-05-01').keys[0].value")
    assert not _violations(Path("x.bicep"), "var k = listKeys('${site.id}/host/default', '2024-04-01').systemKeys.a")
    assert not _violations(Path("x.py"), f"AccountKey={AZURITE_KEY};")
    assert not _violations(Path("x.py"), "f'AccountKey={AZURITE_KEY};'")
