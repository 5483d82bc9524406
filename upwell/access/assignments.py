"""Grant, list and revoke upwell's roles: Azure role assignments on the storage account, or a local file.

Followed: learn.microsoft.com "Add or edit Azure role assignment conditions using the REST API"
(PUT .../providers/Microsoft.Authorization/roleAssignments/{name}?api-version=2022-04-01 with
``roleDefinitionId``, ``principalId``, ``principalType``, ``condition``, ``conditionVersion`` "2.0" and
``description``), the Role Assignments REST reference (List For Scope with ``$filter=atScope()`` or
``principalId eq '{id}'``; Delete), and azure-mgmt-authorization's ``role_assignments`` operations.

Both stores hold the same records (``Assignment``), so the caller check (``upwell.access.caller``)
evaluates the same conditions locally and on Azure. ARM errors are translated here only.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from upwell.access.roles import Grant, from_description
from upwell.errors import AccessError, ConfigError


@dataclass(frozen=True)
class Assignment:
    """One role assignment as either store holds it."""

    name: str
    scope: str
    principal: str
    role_definition: str  # the role definition's GUID
    condition: str = ""
    description: str = ""
    principal_type: str = "User"

    @property
    def grant(self) -> Grant | None:
        """The upwell grant it records; None for an assignment upwell did not make."""
        return from_description(self.principal, self.description, self.principal_type)


class ArmAssignments:
    """Role assignments at ``scope`` (the storage account's resource id) through the Authorization
    management client. Keeps the client and the scope."""

    def __init__(self, scope: str, *, subscription_id: str, credential: Any, client_kwargs: dict | None = None):
        from azure.mgmt.authorization import AuthorizationManagementClient

        self.scope = scope
        self.subscription_id = subscription_id
        self.credential = credential
        self.client = AuthorizationManagementClient(credential, subscription_id, **(client_kwargs or {}))

    def grant(self, g: Grant) -> bool:
        """Create the assignment; False when it exists already (409 RoleAssignmentExists)."""
        from azure.core.exceptions import HttpResponseError
        from azure.mgmt.authorization.models import RoleAssignmentCreateParameters

        body = RoleAssignmentCreateParameters(
            role_definition_id=f"/subscriptions/{self.subscription_id}/providers/Microsoft.Authorization/"
                               f"roleDefinitions/{g.role_definition}",
            principal_id=g.principal, principal_type=g.principal_type, description=g.description,
            condition=g.condition, condition_version="2.0")
        try:
            self.client.role_assignments.create(self.scope, g.name(self.scope), body)
        except HttpResponseError as exc:
            if _code(exc) == "RoleAssignmentExists":
                return False
            raise _error(exc, f"grant {g.role.value} in {g.project} to {g.principal}") from None
        return True

    def list(self, principal: str | None = None) -> list[Assignment]:
        """Every assignment that applies at the scope (of ``principal``, where given)."""
        from azure.core.exceptions import HttpResponseError

        query = f"principalId eq '{principal}'" if principal else "atScope()"
        try:
            found = list(self.client.role_assignments.list_for_scope(self.scope, filter=query))
        except HttpResponseError as exc:
            raise _error(exc, f"list role assignments at {self.scope}") from None
        return [Assignment(ra.name, ra.scope or self.scope, ra.principal_id,
                           (ra.role_definition_id or "").rsplit("/", 1)[-1], ra.condition or "",
                           ra.description or "", ra.principal_type or "User") for ra in found]

    def revoke(self, a: Assignment) -> None:
        from azure.core.exceptions import HttpResponseError

        try:
            self.client.role_assignments.delete(a.scope, a.name)
        except HttpResponseError as exc:
            if exc.status_code != 404:  # gone already: what revoke wanted
                raise _error(exc, f"revoke {a.name}") from None


class FileAssignments:
    """The local stack's role assignments: a JSON file of Assignment records (``UPWELL_ACCESS_FILE``).
    No file means no grants at all: the local stack has one user, who operates it."""

    def __init__(self, path: Path, scope: str = "local"):
        self.path, self.scope = Path(path), scope

    def exists(self) -> bool:
        return self.path.exists()

    def _load(self) -> list[Assignment]:
        if not self.path.exists():
            return []
        try:
            return [Assignment(**row) for row in json.loads(self.path.read_text(encoding="utf-8"))]
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"UPWELL_ACCESS_FILE {self.path} is not a list of assignments: {exc}") from None

    def _save(self, rows: list[Assignment]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps([asdict(r) for r in rows], indent=2), encoding="utf-8")
        tmp.replace(self.path)

    def grant(self, g: Grant) -> bool:
        rows = self._load()
        name = g.name(self.scope)
        if any(r.name == name for r in rows):
            self._save(rows)  # a first grant of nothing new still makes the file: the stack now has roles
            return False
        rows.append(Assignment(name, self.scope, g.principal, g.role_definition, g.condition, g.description,
                               g.principal_type))
        self._save(rows)
        return True

    def list(self, principal: str | None = None) -> list[Assignment]:
        return [r for r in self._load() if principal is None or r.principal.lower() == principal.lower()]

    def revoke(self, a: Assignment) -> None:
        self._save([r for r in self._load() if r.name != a.name])


def _code(exc: Any) -> str:
    return str(getattr(getattr(exc, "error", None), "code", None) or "")


def _error(exc: Any, what: str) -> AccessError:
    message = (str(getattr(getattr(exc, "error", None), "message", "") or exc).splitlines() or [""])[0][:300]
    return AccessError(f"{what}: {_code(exc) or exc.status_code}: {message}", code=_code(exc),
                       status=exc.status_code)
