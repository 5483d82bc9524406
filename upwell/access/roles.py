"""upwell's three roles and the Azure role assignments each one is made of.

A grant is one role assignment on the storage account: a built-in data role (learn.microsoft.com
"Azure built-in roles": Storage Blob Data Contributor ba92f5b4-2d11-453d-a403-e96b0029c9fe, Storage Blob
Data Reader 2a2b9908-6ea1-4ae2-8e65-a410df84e7d1) with a version 2.0 condition that keeps it to one
project (``upwell.access.conditions``). Its ``description`` marks it as upwell's, so ``list`` and
``revoke`` find exactly the assignments ``grant`` made.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from enum import Enum

from upwell.access import conditions
from upwell.errors import InputRejected

CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"
READER = "2a2b9908-6ea1-4ae2-8e65-a410df84e7d1"
OWNER = "b7e6dc6d-f1e8-4753-8033-0f276bb0955b"  # Storage Blob Data Owner: every blob data action
DATA_ACTIONS = {  # the blob data actions of each built-in role (role-based-access-control/built-in-roles)
    CONTRIBUTOR: (f"{conditions.BLOBS}/read", *conditions.WRITES),
    READER: (f"{conditions.BLOBS}/read",),
    OWNER: (f"{conditions.BLOBS}/read", *conditions.WRITES),
}
MARK = "upwell-access"  # the description's first word on every assignment upwell makes
_NAMESPACE = uuid.UUID("4f5d6f2e-8a8b-4f51-9a2c-0b7d2f0c7a11")


class Role(str, Enum):
    SUBMITTER = "submitter"  # upload and read under incoming/<P>/, read P's results and reports
    VIEWER = "viewer"  # read incoming/<P>/ and P's results and reports; write nothing
    OPERATOR = "operator"  # a submitter who also registers payload definitions and pipeline rules


class UnknownRole(InputRejected):
    """A role name that is none of submitter, viewer, operator."""


def role(text: str) -> Role:
    try:
        return Role(text.strip().lower())
    except ValueError:
        raise UnknownRole(f"role {text!r} is not one of {', '.join(r.value for r in Role)}", field="role") from None


@dataclass(frozen=True)
class Grant:
    """One role of one principal in one project, as one Azure role assignment."""

    principal: str  # the Entra object id (a user, a group, a B2B guest or a service principal)
    project: str
    role: Role
    principal_type: str = "User"

    @property
    def role_definition(self) -> str:
        return READER if self.role is Role.VIEWER else CONTRIBUTOR

    @property
    def condition(self) -> str:
        return conditions.condition(self.project, write=self.role is not Role.VIEWER,
                                    operator=self.role is Role.OPERATOR)

    @property
    def description(self) -> str:
        return f"{MARK} project={self.project} role={self.role.value}"

    def name(self, scope: str) -> str:
        """The assignment's name: a GUID derived from scope, principal, project and role, so a second
        grant of the same role is the same assignment (ARM answers 409 RoleAssignmentExists)."""
        key = f"{scope.lower()}|{self.principal.lower()}|{self.project}|{self.role.value}"
        return str(uuid.uuid5(_NAMESPACE, key))


def from_description(principal: str, description: str | None, principal_type: str = "User") -> Grant | None:
    """The Grant an assignment's description records; None for an assignment upwell did not make."""
    words = (description or "").split()
    if not words or words[0] != MARK:
        return None
    fields = dict(w.split("=", 1) for w in words[1:] if "=" in w)
    try:
        return Grant(principal, conditions.check_project(fields.get("project", "")), role(fields.get("role", "")),
                     principal_type)
    except InputRejected:
        return None
