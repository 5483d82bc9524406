"""Checks for what only shows on a real subscription: lost dead letters and a redeploy that fails.

CKV_UPW_6  A storage account keeps the path Event Grid's dead letters take: networkAcls.bypass names
           AzureServices, and publicNetworkAccess is not 'Disabled' (which refuses the trusted-service
           exception too; Event Grid writes dead letters from outside the virtual network).
CKV_UPW_7  A Key Vault with purge protection says how it comes back after `azd down`: createMode is set
           (the template's recover switch). Without it, re-creating the soft-deleted name fails for the
           whole retention period.

An expression where a literal is needed fails: the value must be visible here.
"""

from __future__ import annotations

from typing import Any

from checkov.bicep.checks.resource.base_resource_check import BaseResourceCheck
from checkov.common.models.enums import CheckCategories, CheckResult
from upwell_bicep import unwrap


def _properties(conf: dict[str, Any]) -> dict[str, Any]:
    properties = unwrap(conf).get("properties")
    return properties if isinstance(properties, dict) else {}


class DeadLettersGetThrough(BaseResourceCheck):
    def __init__(self) -> None:
        super().__init__(name="Storage account lets Event Grid's identity-based dead letters through",
                         id="CKV_UPW_6", categories=(CheckCategories.NETWORKING,),
                         supported_resources=("Microsoft.Storage/storageAccounts",))

    def scan_resource_conf(self, conf: dict[str, Any]) -> CheckResult:
        self.evaluated_keys = ["properties/publicNetworkAccess", "properties/networkAcls/bypass"]
        props = _properties(conf)
        acls = props.get("networkAcls")
        bypass = acls.get("bypass") if isinstance(acls, dict) else None
        trusted = isinstance(bypass, str) and "AzureServices" in [b.strip() for b in bypass.split(",")]
        open_endpoint = props.get("publicNetworkAccess") in ("Enabled", None)
        return CheckResult.PASSED if trusted and open_endpoint else CheckResult.FAILED


class VaultComesBack(BaseResourceCheck):
    def __init__(self) -> None:
        super().__init__(name="Key Vault with purge protection sets createMode (recover after azd down)",
                         id="CKV_UPW_7", categories=(CheckCategories.GENERAL_SECURITY,),
                         supported_resources=("Microsoft.KeyVault/vaults",))

    def scan_resource_conf(self, conf: dict[str, Any]) -> CheckResult:
        self.evaluated_keys = ["properties/enablePurgeProtection", "properties/createMode"]
        props = _properties(conf)
        ok = props.get("enablePurgeProtection") is True and bool(props.get("createMode"))
        return CheckResult.PASSED if ok else CheckResult.FAILED


dead_letters_get_through = DeadLettersGetThrough()
vault_comes_back = VaultComesBack()
