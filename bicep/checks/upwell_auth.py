"""CKV_UPW_8: the Function App's built-in authentication requires an Entra ID sign-in (issue 27).

A ``Microsoft.Web/sites/config`` named ``authsettingsV2`` (bicep-types-az, Microsoft.Web 2025-03-01:
``SiteAuthSettingsV2Properties``) must set, literally:
- ``platform.enabled`` true and ``globalValidation.requireAuthentication`` true;
- ``globalValidation.unauthenticatedClientAction`` 'RedirectToLoginPage', 'Return401' or 'Return403'
  (never 'AllowAnonymous': no anonymous access to the dashboard or the API);
- ``identityProviders.azureActiveDirectory.enabled`` true with a ``registration.clientId``;
- ``globalValidation.excludedPaths`` nothing but the blobs and Event Grid extensions' webhooks (Event Grid's
  deliveries, which carry a system key instead of a sign-in).
And every Function App (``Microsoft.Web/sites`` of a ``functionapp`` kind) in a file has such a config:
the site check fails where none is declared beside it.
"""

from __future__ import annotations

from typing import Any

from checkov.bicep.checks.resource.base_resource_check import BaseResourceCheck
from checkov.common.models.enums import CheckCategories, CheckResult
from upwell_bicep import parse, scanned_file, unwrap

CLOSED = ("RedirectToLoginPage", "Return401", "Return403")
WEBHOOKS = ("/runtime/webhooks/blobs", "/runtime/webhooks/eventgrid")


def _get(body: Any, *path: str) -> Any:
    for key in path:
        body = body.get(key) if isinstance(body, dict) else None
    return body


def auth_problems(props: Any) -> list[str]:
    """What an authsettingsV2 body lacks; [] when it requires an Entra ID sign-in."""
    problems = []
    if _get(props, "platform", "enabled") is not True:
        problems.append("platform.enabled is not true")
    if _get(props, "globalValidation", "requireAuthentication") is not True:
        problems.append("globalValidation.requireAuthentication is not true")
    if _get(props, "globalValidation", "unauthenticatedClientAction") not in CLOSED:
        problems.append(f"globalValidation.unauthenticatedClientAction is not one of {', '.join(CLOSED)}")
    aad = _get(props, "identityProviders", "azureActiveDirectory")
    if _get(aad, "enabled") is not True or not _get(aad, "registration", "clientId"):
        problems.append("identityProviders.azureActiveDirectory is not enabled with a registration.clientId")
    excluded = _get(props, "globalValidation", "excludedPaths") or []
    if not isinstance(excluded, list) or any(p not in WEBHOOKS for p in excluded):
        problems.append(f"globalValidation.excludedPaths leaves more than {' and '.join(WEBHOOKS)} open")
    return problems


class EntraSignInRequired(BaseResourceCheck):
    def __init__(self) -> None:
        super().__init__(name="Function App requires an Entra ID sign-in (authsettingsV2, no anonymous access)",
                         id="CKV_UPW_8", categories=(CheckCategories.IAM,),
                         supported_resources=("Microsoft.Web/sites/config", "Microsoft.Web/sites"))

    def scan_resource_conf(self, conf: dict[str, Any]) -> CheckResult:
        body = unwrap(conf)
        if self.entity_type == "Microsoft.Web/sites":
            if "functionapp" not in str(body.get("kind", "")):
                return CheckResult.UNKNOWN
            self.evaluated_keys = ["kind"]
            if not _has_auth_config(self):
                self.details.append("no Microsoft.Web/sites/config 'authsettingsV2' with this site as its parent")
                return CheckResult.FAILED
            return CheckResult.PASSED
        if str(body.get("name", "")).strip("'\"") != "authsettingsV2":
            return CheckResult.UNKNOWN
        self.evaluated_keys = ["properties/globalValidation", "properties/identityProviders", "properties/platform"]
        problems = auth_problems(body.get("properties"))
        self.details.extend(problems)
        return CheckResult.FAILED if problems else CheckResult.PASSED


def _has_auth_config(check: Any) -> bool:
    """Whether the scanned file declares an authsettingsV2 config whose parent is the checked site."""
    path = scanned_file(check)
    site = (getattr(check, "entity_path", "") or "").rsplit(":", 1)[-1]
    resources = parse(path).get("resources", {}) if path else {}
    for res in resources.values():
        body = unwrap(res.get("config")) if isinstance(res, dict) else None
        if res.get("type") == "Microsoft.Web/sites/config" and isinstance(body, dict) \
                and str(body.get("name", "")).endswith("authsettingsV2") and body.get("parent") in (site, None):
            return True
    return False


entra_sign_in_required = EntraSignInRequired()
