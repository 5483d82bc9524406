"""Who is asking, and which projects that opens: the caller of an HTTP function, read once per request.

On Azure the Function App's built-in authentication (Entra ID; Bicep's ``authsettingsV2``) signs the user in
and passes the caller to the function in ``X-MS-CLIENT-PRINCIPAL``: base64 of the JSON
``{"auth_typ", "claims": [{"typ", "val"}], "name_typ", "role_typ"}``, as App Service documents it ("Work with
user identities in Azure App Service authentication: decoding the client principal header"). App Service
strips that header from incoming requests, so only the platform sets it; the local devhost accepts a test
principal in the same format (``upwell.local.devhost.web``), and this module reads both alike.

The caller's app roles (claims of type ``role_typ``, or ``roles``) and groups (``groups``) map to projects
through one setting, ``UPWELL_PROJECT_ROLES`` (``Settings.project_roles``; ``"*"`` opens every project). A
request without a principal came in on a function key (the host checked it): automation, which sees every
project and is logged as such.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass

from upwell import logs
from upwell.errors import PrincipalInvalid, ProjectForbidden

log = logs.get("upwell.access.principal")

HEADER = "x-ms-client-principal"
KEY_HEADER = "x-functions-key"
EVERY = "*"
ROLE_TYPES = ("roles", "http://schemas.microsoft.com/ws/2008/06/identity/claims/role")
GROUP_TYPES = ("groups", "http://schemas.microsoft.com/ws/2008/06/identity/claims/groups")
NAME_TYPES = ("preferred_username", "name", "upn", "email",
              "http://schemas.xmlsoap.org/ws/2005/05/identity/claims/name",
              "http://schemas.xmlsoap.org/ws/2005/05/identity/claims/emailaddress")
MAX_HEADER = 16 * 1024  # App Service's principal of a user in many groups is a few KiB


@dataclass(frozen=True)
class Caller:
    """One request's caller. ``kind``: "user" (a signed-in principal) or "function_key" (automation).
    ``projects``: the projects it may see and act on; None for automation (every project)."""

    kind: str
    name: str
    projects: frozenset[str] | None
    roles: tuple[str, ...] = ()

    @property
    def everything(self) -> bool:
        return self.projects is None or EVERY in self.projects

    def allows(self, project: str) -> bool:
        return self.everything or project in (self.projects or ())

    def require(self, project: str, what: str) -> None:
        """Raise ProjectForbidden unless the caller may act on ``project``."""
        if not self.allows(project):
            raise ProjectForbidden(f"{self.name or 'this caller'} may not {what} in project {project!r} "
                                   f"(their projects: {', '.join(sorted(self.projects or ())) or 'none'})")


def decode(header: str) -> dict:
    """The principal document of an ``X-MS-CLIENT-PRINCIPAL`` value; PrincipalInvalid names what is wrong."""
    if len(header) > MAX_HEADER:
        raise PrincipalInvalid(f"X-MS-CLIENT-PRINCIPAL is {len(header)} bytes; at most {MAX_HEADER}")
    try:
        doc = json.loads(base64.b64decode(header.strip() + "=" * (-len(header.strip()) % 4), validate=True))
    except (binascii.Error, ValueError):
        raise PrincipalInvalid("X-MS-CLIENT-PRINCIPAL is not base64-encoded JSON") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("claims"), list):
        raise PrincipalInvalid("X-MS-CLIENT-PRINCIPAL must be a JSON object with a 'claims' list")
    for i, claim in enumerate(doc["claims"]):
        if not (isinstance(claim, dict) and isinstance(claim.get("typ"), str) and isinstance(claim.get("val"), str)):
            raise PrincipalInvalid(f"X-MS-CLIENT-PRINCIPAL claims[{i}] must be an object with string 'typ' and 'val'")
    return doc


def of_user(doc: dict, project_roles: Mapping[str, tuple[str, ...]]) -> Caller:
    """A signed-in caller: the name claim, and the projects its roles and groups map to."""
    claims = [(c["typ"], c["val"]) for c in doc["claims"]]
    role_types = {doc.get("role_typ") or "", *ROLE_TYPES} - {""}
    roles = tuple(v for t, v in claims if t in role_types)
    groups = tuple(v for t, v in claims if t in GROUP_TYPES)
    names = [v for t, v in claims if t == doc.get("name_typ")] + [v for t, v in claims if t in NAME_TYPES]
    projects = frozenset(p for key in (*roles, *groups) for p in project_roles.get(key, ()))
    return Caller("user", names[0] if names else "", projects, roles)


def caller(headers: Mapping[str, str], params: Mapping[str, str], project_roles: Mapping[str, tuple[str, ...]],
           route: str = "", method: str = "GET") -> Caller:
    """The caller of one request: the principal where the platform passed one, else automation on a key.
    Every call is logged with who made it: actions (anything but GET) at info, reads (the dashboard polls
    every 1.5 s) at debug."""
    lowered = {k.lower(): v for k, v in headers.items()}
    header = lowered.get(HEADER)
    emit = log.debug if method.upper() in ("GET", "HEAD") else log.info
    if header:
        who = of_user(decode(header), project_roles)
        emit("access.user", name=who.name, projects=sorted(who.projects or ()), route=route, method=method)
        return who
    via = "function key" if lowered.get(KEY_HEADER) or params.get("code") else "no key (local host)"
    emit("access.function_key", via=via, route=route, method=method)  # automation only: never a person's view
    return Caller("function_key", via, None)
