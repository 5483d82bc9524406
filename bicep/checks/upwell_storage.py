"""Storage account settings that checkov's own Bicep rules miss or under-check.

CKV_UPW_1  allowBlobPublicAccess is literally false (no anonymous containers).
CKV_UPW_2  allowSharedKeyAccess is literally false (no account keys, no key SAS).
CKV_UPW_3  minimumTlsVersion is TLS1_2 or newer.

An expression (a parameter, a ternary) fails: the value must be visible here.
"""

from __future__ import annotations

from typing import Any

from checkov.bicep.checks.resource.base_resource_check import BaseResourceCheck
from checkov.common.models.enums import CheckCategories, CheckResult
from upwell_bicep import unwrap

STORAGE = ("Microsoft.Storage/storageAccounts",)


class _StorageProperty(BaseResourceCheck):
    key = ""
    allowed: tuple[Any, ...] = ()

    def __init__(self, name: str, id: str) -> None:
        super().__init__(name=name, id=id, categories=(CheckCategories.GENERAL_SECURITY,),
                         supported_resources=STORAGE)

    def scan_resource_conf(self, conf: dict[str, Any]) -> CheckResult:
        self.evaluated_keys = [f"properties/{self.key}"]
        properties = unwrap(conf).get("properties")
        if not isinstance(properties, dict):
            return CheckResult.FAILED
        value = properties.get(self.key)
        ok = any(value is a if isinstance(a, bool) else value == a for a in self.allowed)
        return CheckResult.PASSED if ok else CheckResult.FAILED


class BlobPublicAccessOff(_StorageProperty):
    key = "allowBlobPublicAccess"
    allowed = (False,)

    def __init__(self) -> None:
        super().__init__("Storage account sets allowBlobPublicAccess to false", "CKV_UPW_1")


class SharedKeyAccessOff(_StorageProperty):
    key = "allowSharedKeyAccess"
    allowed = (False,)

    def __init__(self) -> None:
        super().__init__("Storage account sets allowSharedKeyAccess to false", "CKV_UPW_2")


class MinimumTls12(_StorageProperty):
    key = "minimumTlsVersion"
    allowed = ("TLS1_2", "TLS1_3")

    def __init__(self) -> None:
        super().__init__("Storage account sets minimumTlsVersion to TLS1_2 or newer", "CKV_UPW_3")


blob_public_access_off = BlobPublicAccessOff()
shared_key_access_off = SharedKeyAccessOff()
minimum_tls_12 = MinimumTls12()
