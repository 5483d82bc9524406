"""CKV_UPW_5: a Batch account accepts only Entra ID on its data plane
(allowedAuthenticationModes is exactly ['AAD']): no shared keys, and no task
authentication tokens.
"""

from __future__ import annotations

from typing import Any

from checkov.bicep.checks.resource.base_resource_check import BaseResourceCheck
from checkov.common.models.enums import CheckCategories, CheckResult
from upwell_bicep import unwrap


class BatchEntraOnly(BaseResourceCheck):
    def __init__(self) -> None:
        super().__init__(
            name="Batch account allows only Entra ID (AAD) authentication",
            id="CKV_UPW_5",
            categories=(CheckCategories.IAM,),
            supported_resources=("Microsoft.Batch/batchAccounts",),
        )

    def scan_resource_conf(self, conf: dict[str, Any]) -> CheckResult:
        self.evaluated_keys = ["properties/allowedAuthenticationModes"]
        properties = unwrap(conf).get("properties")
        modes = properties.get("allowedAuthenticationModes") if isinstance(properties, dict) else None
        return CheckResult.PASSED if modes == ["AAD"] else CheckResult.FAILED


batch_entra_only = BatchEntraOnly()
