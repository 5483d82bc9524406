"""The deployment's blind spots (issue 23, item 9), read from the parsed templates and the hook run for real.

- Private mode keeps Event Grid's dead letters: the account's public endpoint is denied to every network
  but never 'Disabled' (that refuses trusted services too), the trusted-services bypass stays, and the
  subscriptions dead-letter with the topic's system-assigned identity, the only kind that a storage
  firewall lets through.
- Every subnet that calls out has explicit outbound access (a NAT gateway with a static public IP) and
  none leans on the retired default outbound access.
- The Key Vault's name is unique per resource group and environment, and after `azd down` (the vault is
  soft-deleted, purge protection keeps its name) the next `azd up` recovers it: preprovision.sh, run here
  under `sh` with `az` and `azd` replaced by recording stand-ins, asks for createMode recover.
- The Batch user's password is a @secure() parameter made once per environment, never a uniqueString.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "bicep" / "hooks" / "preprovision.sh"
sys.path.insert(0, str(ROOT / "bicep" / "tools"))

import upwell_iac as iac  # noqa: E402


def _ref(name: str, prop: str = "id") -> dict:
    """A property access (``name.prop``) as pycep's tree writes it."""
    return {"operator": {"type": "property_accessor", "operands": {"operand_1": name, "operand_2": prop}}}


def _if(condition: str, then, otherwise) -> dict:
    return {"operator": {"type": "conditional", "operands": {"condition": condition, "true_value": then,
                                                              "false_value": otherwise}}}


@pytest.fixture(scope="module")
def trees() -> dict[str, dict]:
    try:
        iac.iac_bin("python")
    except iac.IacVenvMissing as exc:
        pytest.fail(str(exc))
    return iac.bicep_json()


def test_dead_letters_still_arrive_in_private_mode(trees):
    props = trees["bicep/modules/storage.bicep"]["resources"]["storage"]["config"]["properties"]
    assert props["publicNetworkAccess"] == "Enabled"  # 'Disabled' would refuse the trusted-service exception
    acls = props["networkAcls"]
    assert acls["bypass"] == "AzureServices"
    assert acls["defaultAction"] == _if("privateOnly", "Deny", "Allow") and not acls["ipRules"]
    assert not acls["virtualNetworkRules"]
    subs = trees["bicep/modules/events.bicep"]["resources"]["subscriptions"]["config"]["config"]["properties"]
    dead = subs["deadLetterWithResourceIdentity"]
    assert dead["identity"] == {"type": "SystemAssigned"}  # behind a firewall only this identity is let in
    assert dead["deadLetterDestination"]["endpointType"] == "StorageBlob"
    assert "deadLetterDestination" not in subs
    topic = trees["bicep/modules/eventtopic.bicep"]["resources"]
    assert topic["topic"]["config"]["identity"] == {"type": "SystemAssigned"}
    writer = topic["deadLetterWriter"]["config"]
    assert writer["scope"] == "deadLetterContainer"
    assert writer["properties"]["principalId"] == _ref("topic", _ref("identity", "principalId"))


def _subnets(trees) -> dict[str, dict]:
    variables = trees["bicep/modules/network.bicep"]["variables"]
    return {v["value"]["name"]: v["value"]["properties"] for v in variables.values()
            if isinstance(v.get("value"), dict) and "addressPrefix" in v["value"].get("properties", {})}


def test_every_subnet_that_calls_out_has_a_nat_gateway(trees):
    subnets = _subnets(trees)
    assert set(subnets) == {"snet-workers", "snet-app", "snet-pe", "snet-aci"}
    for name, props in subnets.items():
        assert props["defaultOutboundAccess"] is False, name
        if name != "snet-pe":  # private endpoints make no outbound calls
            assert props["natGateway"] == {"id": _ref("nat")}, name
    res = trees["bicep/modules/network.bicep"]["resources"]
    nat, ip = res["nat"], res["natIp"]
    assert "properties" in nat["config"] and "properties" in ip["config"]  # unconditional: no if () wrapper
    assert nat["config"]["properties"]["publicIpAddresses"] == [{"id": _ref("natIp")}]
    assert ip["config"]["sku"] == {"name": "Standard"}
    assert ip["config"]["properties"]["publicIPAllocationMethod"] == "Static"
    assert "natGateway" not in trees["bicep/modules/network.bicep"]["parameters"]  # not optional any more


def test_key_vault_name_is_per_environment_and_recovered_after_azd_down(trees):
    main = trees["bicep/main.bicep"]
    name = main["variables"]["keyVaultName"]["value"]
    assert "uniqueString(subscriptionResourceId('Microsoft.Resources/resourceGroups', rgName), environmentName)" \
        in name
    vault = trees["bicep/modules/keyvault.bicep"]["resources"]["vault"]["config"]["properties"]
    assert vault["enablePurgeProtection"] is True and vault["enableSoftDelete"] is True
    assert vault["createMode"] == _if("recover", "recover", "default")
    assert main["parameters"]["keyVaultRecover"]["default"] is False


def test_batch_user_password_is_a_secret_of_the_environment(trees):
    batch = trees["bicep/modules/batch.bicep"]
    account = batch["resources"]["batchPools"]["config"]["config"]["properties"]["userAccounts"][0]
    assert account["password"] == "userPassword"
    for params in (batch["parameters"]["userPassword"], trees["bicep/main.bicep"]["parameters"]["batchUserPassword"]):
        assert {"type": "secure"} in params["decorators"], params
        assert params.get("default") is None
    text = (ROOT / "bicep" / "modules" / "batch.bicep").read_text()
    assert "password: '${uniqueString" not in text


FAKE = r"""#!/bin/sh
printf '%s %s\n' "$(basename "$0")" "$*" >> "$FAKE_DIR/calls"
case "$(basename "$0") $1 $2" in
  "az provider show") echo Registered; exit 0 ;;
  "az keyvault show-deleted") [ -f "$FAKE_DIR/deleted" ] && echo "$(cat "$FAKE_DIR/deleted")" && exit 0; exit 3 ;;
  "az keyvault list-deleted") cat "$FAKE_DIR/deleted_ids" 2>/dev/null; exit 0 ;;
  "az ad app") [ "$3" = create ] && echo 00000000-0000-0000-0000-0000000000a1; exit 0 ;;
  "azd env set") printf '%s=%s\n' "$3" "$4" >> "$FAKE_DIR/env"; exit 0 ;;
esac
echo "unexpected call: $*" >&2
exit 2
"""


def _hook(tmp_path: Path, **env: str) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("az", "azd"):
        path = bin_dir / tool
        path.write_text(FAKE)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "env").write_text("")
    base = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_DIR": str(tmp_path), "AZURE_ENV_NAME": "t",
            "BATCH_SERVICE_PRINCIPAL_OBJECT_ID": "sp", "UPWELL_OWNER": "someone"}
    proc = subprocess.run(["sh", str(HOOK)], env={**base, **env}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert all(v not in proc.stdout + proc.stderr for v in env.values() if len(v) > 16), "a secret was printed"
    return dict(line.split("=", 1) for line in (tmp_path / "env").read_text().splitlines())


def test_the_hook_recovers_the_vault_that_azd_down_left(tmp_path):
    (tmp_path / "fresh").mkdir()
    fresh = _hook(tmp_path / "fresh")
    assert fresh["UPWELL_KEY_VAULT_RECOVER"] == "false"
    assert fresh["UPWELL_AUTH_CLIENT_ID"] == "00000000-0000-0000-0000-0000000000a1"  # the sign-in app, made once
    password = fresh["UPWELL_BATCH_USER_PASSWORD"]
    assert len(password) >= 32 and password != _hook(tmp_path / "fresh")["UPWELL_BATCH_USER_PASSWORD"]
    # azd down: the vault this environment deployed (an azd output) is soft-deleted
    down = tmp_path / "down"
    down.mkdir()
    (down / "deleted").write_text("kv-upw-abc\n")
    again = _hook(down, AZURE_KEY_VAULT_NAME="kv-upw-abc", UPWELL_BATCH_USER_PASSWORD=password,
                  UPWELL_AUTH_CLIENT_ID=fresh["UPWELL_AUTH_CLIENT_ID"])
    assert again == {"UPWELL_KEY_VAULT_RECOVER": "true"}  # the password and the sign-in app made once are kept
    # a new machine without the output: any upwell vault deleted from the environment's resource group
    lost = tmp_path / "lost"
    lost.mkdir()
    (lost / "deleted_ids").write_text("/subscriptions/s/resourceGroups/RG-UPWELL-T/providers/"
                                      "Microsoft.KeyVault/vaults/kv-upw-abc\n")
    assert _hook(lost, UPWELL_BATCH_USER_PASSWORD=password)["UPWELL_KEY_VAULT_RECOVER"] == "true"
    other = tmp_path / "other"
    other.mkdir()
    (other / "deleted_ids").write_text("/subscriptions/s/resourceGroups/rg-upwell-prod/providers/"
                                       "Microsoft.KeyVault/vaults/kv-upw-xyz\n")
    assert _hook(other, UPWELL_BATCH_USER_PASSWORD=password)["UPWELL_KEY_VAULT_RECOVER"] == "false"
