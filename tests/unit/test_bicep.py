"""The Azure deployment (bicep/) parses, passes checkov with upwell's own checks,
writes down a reason for every suppression, and the checks can fail.

The tools run in the IaC venv (.venv-iac, `make iac-install`); without it these
tests fail: they never skip.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bicep" / "tools"))

import upwell_iac as iac  # noqa: E402

from upwell.pools import build_batch  # noqa: E402

SKIP_RE = re.compile(r"checkov:skip=([A-Za-z0-9_]+)\s*:?(.*)")
GUID_RE = re.compile(r"'([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})'")


def _venv_or_fail() -> None:
    try:
        iac.iac_bin("python")
        iac.iac_bin("checkov")
    except iac.IacVenvMissing as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="module")
def trees() -> dict[str, dict]:
    _venv_or_fail()
    return iac.bicep_json()


@pytest.fixture(scope="module")
def checkov_report() -> dict:
    _venv_or_fail()
    code, report, stderr = iac.checkov("--config-file", "bicep/.checkov.yaml")
    report["_exit"] = code
    report["_stderr"] = stderr
    return report


def _skips_in_templates() -> dict[tuple[str, str], str]:
    """{(file, check id): reason} for every inline suppression in bicep/."""
    found = {}
    for path in iac.bicep_files():
        for line in path.read_text().splitlines():
            m = SKIP_RE.search(line)
            if m:
                found[(str(path.relative_to(ROOT)), m.group(1))] = m.group(2).strip()
    return found


def test_every_bicep_file_parses(trees):
    expected = {str(p.relative_to(ROOT)) for p in iac.bicep_files()}
    assert set(trees) == expected
    assert "bicep/main.bicep" in trees
    assert trees["bicep/main.bicep"]["globals"]["scope"]["value"] == "subscription"


def test_every_module_call_resolves_to_a_file(trees):
    for name, tree in trees.items():
        for module in (tree.get("modules") or {}).values():
            target = (ROOT / name).parent / module["detail"]["path"]
            assert target.is_file(), f"{name}: module {module['detail']['path']} does not exist"


def test_checkov_passes_with_the_custom_checks(checkov_report):
    summary = checkov_report["summary"]
    failed = [f"{f['check_id']} {f['resource']} ({f['file_path']})"
              for f in checkov_report["results"].get("failed_checks", [])]
    assert not failed, "checkov failures:\n" + "\n".join(failed)
    assert summary["parsing_errors"] == 0
    assert checkov_report["_exit"] == 0, checkov_report["_stderr"][-2000:]
    passed = checkov_report["results"]["passed_checks"]
    ran = {p["check_id"] for p in passed}
    # A custom check that fails to load is only logged by checkov: make sure each one ran.
    assert set(iac.CUSTOM_CHECKS) <= ran, f"custom checks that did not run: {set(iac.CUSTOM_CHECKS) - ran}"


def test_every_taggable_resource_was_tag_checked(checkov_report):
    tagged = {(p["file_path"], p["resource"]) for p in checkov_report["results"]["passed_checks"]
              if p["check_id"] == "CKV_UPW_4"}
    for kind in ("Microsoft.Resources/resourceGroups", "Microsoft.Storage/storageAccounts", "Microsoft.Web/sites",
                 "Microsoft.Web/serverfarms", "Microsoft.Batch/batchAccounts", "Microsoft.Batch/batchAccounts/pools",
                 "Microsoft.KeyVault/vaults", "Microsoft.ContainerRegistry/registries",
                 "Microsoft.EventGrid/systemTopics", "Microsoft.ManagedIdentity/userAssignedIdentities",
                 "Microsoft.Insights/components", "Microsoft.OperationalInsights/workspaces",
                 "Microsoft.Compute/virtualMachineScaleSets", "Microsoft.Network/virtualNetworks"):
        assert any(resource.startswith(kind + ".") for _, resource in tagged), f"no tag check passed for {kind}"


def test_every_suppression_is_justified_and_used(checkov_report):
    skips = _skips_in_templates()
    assert skips, "expected the documented suppressions in bicep/"
    for (path, check_id), reason in skips.items():
        assert len(reason) >= 40, f"{path}: checkov:skip={check_id} needs a written reason"
        assert not check_id.startswith("CKV_UPW_"), f"{path}: upwell's own checks are never skipped"
    skipped = {(s["file_path"].lstrip("/"), s["check_id"]) for s in checkov_report["results"].get("skipped_checks", [])}
    declared = {(p.removeprefix("bicep/"), c) for p, c in skips}
    assert skipped == declared, "a suppression that suppresses nothing, or a skip not written in a template"
    config = yaml.safe_load((ROOT / "bicep" / ".checkov.yaml").read_text())
    assert "skip-check" not in config, "suppress per resource with a reason, not globally"
    assert config["external-checks-dir"] == ["bicep/checks"]


def test_suppressions_are_listed_in_the_docs():
    docs = (ROOT / "docs" / "deploy.md").read_text()
    for _, check_id in _skips_in_templates():
        assert check_id in docs, f"docs/deploy.md does not explain the {check_id} suppression"


def test_custom_checks_fail_the_bad_snippet():
    _venv_or_fail()
    code, report, _ = iac.checkov("--directory", str(iac.BAD_DIR.relative_to(ROOT)), "--framework", "bicep",
                                  "--external-checks-dir", "bicep/checks", "--check", ",".join(iac.CUSTOM_CHECKS))
    failed = {(f["check_id"], f["resource"]) for f in report["results"]["failed_checks"]}
    assert code != 0
    for check_id in iac.CUSTOM_CHECKS:
        assert any(c == check_id for c, _ in failed), f"{check_id} did not fail on tests/data/bicep_bad"
    # The tag check sees through a module parameter to the tags actually passed.
    assert ("CKV_UPW_4", "Microsoft.ManagedIdentity/userAssignedIdentities.identity") in failed


# Built-in roles the templates use: id -> name (the same in every tenant).
BUILT_IN_ROLES = {
    "b7e6dc6d-f1e8-4753-8033-0f276bb0955b": "Storage Blob Data Owner",
    "ba92f5b4-2d11-453d-a403-e96b0029c9fe": "Storage Blob Data Contributor",
    "974c5e8b-45b9-4653-ba55-5f855dd0fb88": "Storage Queue Data Contributor",
    "19e7f393-937e-4f77-808e-94535e297925": "Storage Queue Data Reader",
    "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3": "Storage Table Data Contributor",
    "76199698-9eea-4c19-bc75-cec21354c6b6": "Storage Table Data Reader",
    "7f951dda-4ed3-4680-a7ca-43fe172d538d": "AcrPull",
    "3913510d-42f4-4e42-8a64-420c390055eb": "Monitoring Metrics Publisher",
    "6aaa78f1-f7de-44ca-8722-c64a23943cae": "Azure Batch Data Contributor",
    "f1a07417-d97a-45cb-824c-7a7467783830": "Managed Identity Operator",
    "9980e02c-c2be-4d73-94e8-173b1dc7cf3c": "Virtual Machine Contributor",
    "b86a8fe4-44ce-4948-aee5-eccb2c155cd7": "Key Vault Secrets Officer",
    "a35466a1-cfd6-450a-b35e-683fcdf30363": "Azure Batch Service Orchestration Role",
    "acdd72a7-3385-48ef-bd42-f606fba81ae7": "Reader",
    "d5a91429-5739-47e2-a06b-3470a27159e7": "EventGrid Data Sender",
    "4633458b-17de-408a-b874-0445c86b69e6": "Key Vault Secrets User",
}


def test_role_definition_ids_are_named():
    """Every role definition id in the templates has the role's name in the comment just above it."""
    seen = set()
    for path in iac.bicep_files():
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            for guid in GUID_RE.findall(line):
                where = f"{path.relative_to(ROOT)}:{i + 1}"
                assert guid in BUILT_IN_ROLES, f"{where}: unknown role id {guid}; add it to BUILT_IN_ROLES"
                comment = []
                j = i - 1
                while j >= 0 and lines[j].strip().startswith("//"):
                    comment.insert(0, lines[j].strip())
                    j -= 1
                assert BUILT_IN_ROLES[guid] + ":" in " ".join(comment), \
                    f"{where}: the comment above should name {BUILT_IN_ROLES[guid]!r}"
                seen.add(guid)
    assert seen == set(BUILT_IN_ROLES), f"roles in the table but not used: {set(BUILT_IN_ROLES) - seen}"


def test_storage_module_has_soft_delete_and_no_keys(trees):
    storage = trees["bicep/modules/storage.bicep"]["resources"]
    props = storage["storage"]["config"]["properties"]
    assert props["allowSharedKeyAccess"] is False
    assert props["allowBlobPublicAccess"] is False
    assert props["minimumTlsVersion"] == "TLS1_2"
    assert props["defaultToOAuthAuthentication"] is True
    blob = storage["blobService"]["config"]["properties"]
    assert blob["deleteRetentionPolicy"]["enabled"] is True
    assert blob["containerDeleteRetentionPolicy"]["enabled"] is True


def test_lifecycle_rules_expire_results_shards_and_checkpoints(trees):
    storage = trees["bicep/modules/storage.bicep"]
    policy = storage["resources"]["lifecycle"]
    assert policy["type"] == "Microsoft.Storage/storageAccounts/managementPolicies"
    days = storage["parameters"]["expireAfterDays"]["default"]
    assert set(days) == {"results", "shards", "checkpoints"} and all(int(v) > 0 for v in days.values())
    text = (ROOT / "bicep/modules/storage.bicep").read_text()
    assert "prefixMatch" in text and "daysAfterModificationGreaterThan: c.value" in text


def test_no_lifecycle_rule_expires_the_uploads_that_shards_reference(trees):
    """Shards read byte ranges of their upload (upwell/shardref.py): no rule may delete or archive incoming/."""
    days = trees["bicep/modules/storage.bicep"]["parameters"]["expireAfterDays"]["default"]
    assert "incoming" not in days
    text = (ROOT / "bicep/modules/storage.bicep").read_text()
    policy = text[text.index("resource lifecycle"):text.index("resource containers")]
    assert "incoming" not in policy and "prefixMatch" in policy


def test_flex_consumption_function_app(trees):
    fa = trees["bicep/modules/functionapp.bicep"]["resources"]
    assert fa["plan"]["config"]["sku"] == {"name": "FC1", "tier": "FlexConsumption"}
    site = fa["site"]["config"]
    cfg = site["properties"]["functionAppConfig"]
    assert cfg["runtime"] == {"name": "python", "version": "3.11"}
    assert cfg["deployment"]["storage"]["authentication"]["type"] == "UserAssignedIdentity"
    assert "scaleAndConcurrency" in cfg
    assert site["identity"]["type"] == "UserAssigned"
    assert site["properties"]["httpsOnly"] is True
    policies = {r["config"]["name"]: r["config"]["properties"]["allow"] for r in fa.values()
                if r["type"] == "Microsoft.Web/sites/basicPublishingCredentialsPolicies"}
    assert policies == {"ftp": False, "scm": False}


def test_batch_pools_start_at_zero_without_autoscale(trees):
    batch = trees["bicep/modules/batch.bicep"]["resources"]
    batch_params = trees["bicep/modules/batch.bicep"]["parameters"]
    account = batch["account"]["config"]["properties"]
    assert account["poolAllocationMode"] == "UserSubscription"
    assert set(account["keyVaultReference"]) == {"id", "url"}
    pool = batch["batchPools"]["config"]["config"]
    props = pool["properties"]
    assert props["scaleSettings"] == {"fixedScale": {"targetDedicatedNodes": 0, "targetLowPriorityNodes": 0,
                                                     "resizeTimeout": "PT15M",
                                                     "nodeDeallocationOption": "TaskCompletion"}}
    vm = props["deploymentConfiguration"]["virtualMachineConfiguration"]
    assert vm["containerConfiguration"]["type"] == "DockerCompatible"
    assert pool["identity"]["type"] == "UserAssigned"
    # `startTask: p.gangs ? null : {...}`: a gang pool's agents are Batch tasks (upwell.pools.build_batch_tasks)
    start = props["startTask"]["operator"]["operands"]["operand_2"]["operator"]
    assert start["type"] == "conditional" and start["operands"]["condition"] == "gangs"
    assert start["operands"]["true_value"] is None
    assert start["operands"]["false_value"]["waitForSuccess"] is False
    assert props["taskSlotsPerNode"] == 1 and "gangs" in str(props["interNodeCommunication"])
    assert batch_params["imageReference"]["default"]["offer"] in build_batch.HPC_OFFERS  # IB drivers, HPC-X
    main = trees["bicep/main.bicep"]["variables"]
    assert main["mpiBatchPool"]["value"]["gangs"] is True and main["cpuBatchPool"]["value"]["gangs"] is False
    keyvault = trees["bicep/modules/keyvault.bicep"]["resources"]["vault"]["config"]["properties"]
    assert keyvault["enableRbacAuthorization"] is True and keyvault["enablePurgeProtection"] is True


def test_budget_alerts(trees):
    budget = trees["bicep/modules/budget.bicep"]
    notes = budget["variables"]["notifications"]["value"]
    got = {(n["thresholdType"], n["threshold"]) for n in notes.values()}
    assert got == {("Actual", 50), ("Actual", 80), ("Actual", 100), ("Forecasted", 100)}
    assert budget["resources"]["budget"]["type"] == "Microsoft.Consumption/budgets"


def test_outputs_for_azd(trees):
    outputs = trees["bicep/main.bicep"]["outputs"]
    for name in ("AZURE_STORAGE_ACCOUNT", "AZURE_FUNCTION_APP_NAME", "AZURE_BATCH_ACCOUNT_URL",
                 "AZURE_CONTAINER_REGISTRY_ENDPOINT", "AZURE_RESOURCE_GROUP", "AZURE_LOCATION",
                 "EVENTGRID_SYSTEM_TOPIC_NAME", "UPWELL_BLOB_TRIGGERS"):
        assert name in outputs
    assert all(re.fullmatch(r"[A-Z][A-Z0-9_]*", name) for name in outputs)


def test_parameters_file_names_real_parameters(trees):
    params = trees["bicep/main.bicep"]["parameters"]
    mapped = yaml.safe_load((ROOT / "bicep" / "main.parameters.json").read_text())["parameters"]
    assert set(mapped) <= set(params), f"unknown parameters: {set(mapped) - set(params)}"
    required = {name for name, p in params.items() if p.get("default") is None}
    assert required <= set(mapped), f"azd cannot fill {required - set(mapped)}"


def test_hooks_read_only_outputs_that_exist(trees):
    outputs = set(trees["bicep/main.bicep"]["outputs"])
    script = (ROOT / "bicep" / "hooks" / "postdeploy.sh").read_text()
    used = set(re.findall(r"\$\{([A-Z][A-Z0-9_]+):\?", script))
    assert used and used <= outputs, f"postdeploy.sh reads {used - outputs}, which main.bicep does not output"
    events = trees["bicep/modules/events.bicep"]["parameters"]
    passed = set(re.findall(r"(\w+)=\"\$\{?[A-Z]", script))
    assert passed == set(events), f"postdeploy.sh passes {passed}, events.bicep takes {set(events)}"


def test_azure_yaml():
    doc = yaml.safe_load((ROOT / "azure.yaml").read_text())
    assert doc["name"] == "upwell"
    assert doc["infra"] == {"provider": "bicep", "path": "bicep", "module": "main"}
    assert doc["services"]["api"] == {"project": ".", "language": "python", "host": "function"}
    for hook in doc["hooks"].values():
        script = ROOT / hook["posix"]["run"]
        assert script.is_file(), script
    assert (ROOT / "bicep" / "main.bicep").is_file()


def test_funcignore_keeps_tooling_and_data_out():
    lines = {ln.strip() for ln in (ROOT / ".funcignore").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")}
    for entry in ("tests/", "bicep/", ".upwell/", "__azurite_db*", "__blobstorage__/", "__queuestorage__/",
                  "node_modules/", ".venv*", "bench/", "docs/", "workers/docker/"):
        assert entry in lines, f".funcignore should list {entry}"
    for needed in ("function_app.py", "host.json", "requirements.txt", "handlers/", "upwell/", "workers/"):
        assert needed not in lines, f".funcignore must not drop {needed}"


def test_agent_containers_keep_the_image_entrypoint(trees):
    """The worker images' entrypoint script runs a full command line as written (and the agent for bare
    options), so the pools' run options must not replace it: that would bypass the non-root image setup."""
    images = list((ROOT / "workers" / "docker").glob("Dockerfile*"))
    assert images and all('ENTRYPOINT ["/app/workers/docker/entrypoint.sh"]' in p.read_text() for p in images)
    main = {k: v["value"] for k, v in trees["bicep/main.bicep"]["variables"].items()}
    for var in ("cpuRunOptions", "mpiRunOptions", "gpuRunOptions"):
        assert "--entrypoint" not in main[var], var
    assert "--gpus" not in main["gpuRunOptions"]  # Batch enables GPUs for container tasks itself
    cloud_init = (ROOT / "bicep" / "modules" / "vmss-cloud-init.yaml").read_text()
    assert "__IMAGE__ python -m workers.agent" in cloud_init and "--entrypoint" not in cloud_init


def test_only_operators_write_payload_definitions(trees):
    """The payloads container: operators get Blob Data Contributor on it alone; every account-wide blob write
    role (Function App, workers, uploaders) carries the ABAC condition that denies writes there."""
    from upwell import names

    rbac = trees["bicep/modules/rbac.bicep"]
    res = rbac["resources"]
    operator = res["operatorPayloads"]["config"]["config"]
    assert operator["scope"] == "payloadsContainer"
    assert operator["properties"]["principalId"] == "operatorPrincipalId"
    assert "payloadsContainerName" in str(rbac["resources"]) or "payloadsContainerName" in str(rbac)
    condition = str(rbac["variables"]["payloadsReadOnly"])
    for action in ("blobs/write", "blobs/add/action", "blobs/delete"):
        assert f"Microsoft.Storage/storageAccounts/blobServices/containers/{action}" in condition
    assert "StringNotEquals" in condition and "payloadsContainerName" in condition
    for name in ("functionStorage", "workerStorage", "deployerStorage"):
        props = res[name]["config"]["config"]["properties"]
        assert "payloadsReadOnly" in str(props["condition"]) and "2.0" in str(props["conditionVersion"]), name
    assert rbac["parameters"]["payloadsContainerName"]["default"] == names.PAYLOADS


def test_the_change_feed_is_on_where_the_reconciler_reads_it(trees):
    main = trees["bicep/main.bicep"]
    source = main["parameters"]["reconcileSource"]
    assert source["default"] == "listing"
    assert {"type": "allowed", "argument": ["listing", "changefeed"]} in source["decorators"]
    assert main["variables"]["functionAppSettings"]["value"]["UPWELL_RECONCILE_SOURCE"] == "reconcileSource"
    enabled = main["modules"]["storage"]["config"]["params"]["changeFeedEnabled"]
    assert enabled == {"operator": {"type": "equals", "operands": {"operand_1": "reconcileSource",
                                                                    "operand_2": "changefeed"}}}
    feed = trees["bicep/modules/storage.bicep"]["resources"]["blobService"]["config"]["properties"]["changeFeed"]
    operands = feed["operator"]["operands"]
    assert operands["condition"] == "changeFeedEnabled"
    assert operands["true_value"] == {"enabled": True, "retentionInDays": "changeFeedRetentionDays"}
    assert operands["false_value"] == {"enabled": False}
