"""CKV_UPW_4: every resource that can carry tags has project, owner, environment
and expiry, so the owner can be asked and leftovers can be found by expiry.

Tags are followed through variables, `union(...)` and module parameters to the
values actually passed (see upwell_bicep.tag_keys). Resources that take no tags
(role assignments and definitions, budgets, diagnostic settings, and child
resources other than the few that do take tags) are not applicable.
"""

from __future__ import annotations

from typing import Any

from checkov.bicep.checks.resource.base_resource_check import BaseResourceCheck
from checkov.common.models.enums import CheckCategories, CheckResult
from upwell_bicep import REQUIRED_TAGS, scanned_file, tag_keys, unwrap

# Extension and proxy resources whose API has no `tags`.
TAGLESS = {
    "Microsoft.Authorization/roleAssignments",
    "Microsoft.Authorization/roleDefinitions",
    "Microsoft.Authorization/locks",
    "Microsoft.Consumption/budgets",
    "Microsoft.Insights/diagnosticSettings",
}
# Child resources whose API does take tags.
TAGGED_CHILDREN = {
    "Microsoft.Batch/batchAccounts/pools",
    "Microsoft.Network/privateDnsZones/virtualNetworkLinks",
}


def takes_tags(resource_type: str) -> bool:
    if resource_type in TAGLESS:
        return False
    return resource_type.count("/") == 1 or resource_type in TAGGED_CHILDREN


class RequiredTags(BaseResourceCheck):
    def __init__(self) -> None:
        super().__init__(
            name="Resource is tagged with project, owner, environment and expiry",
            id="CKV_UPW_4",
            categories=(CheckCategories.CONVENTION,),
            supported_resources=("*",),
        )

    def scan_resource_conf(self, conf: dict[str, Any]) -> CheckResult:
        if not takes_tags(self.entity_type):
            return CheckResult.UNKNOWN
        self.evaluated_keys = ["tags"]
        body = unwrap(conf)
        if "tags" not in body:
            self.details.append(f"no tags; required: {', '.join(REQUIRED_TAGS)}")
            return CheckResult.FAILED
        keys = tag_keys(body["tags"], scanned_file(self))
        missing = [t for t in REQUIRED_TAGS if keys is None or t not in keys]
        if missing:
            self.details.append(f"tags lack {', '.join(missing)}")
            return CheckResult.FAILED
        return CheckResult.PASSED


required_tags = RequiredTags()
