"""Who runs an upwell command, which role-assignment store answers for them, and whether they may write
a path: the operator check before a payload definition is pushed.

The CLI learns the caller's role from the same role assignments that ``upwell access grant`` makes, and
evaluates their conditions with ``upwell.access.grammar`` as Azure Storage would:
- on Azure (``UPWELL_ACCESS_SCOPE`` set), the caller is the signed-in identity: the ``oid`` claim of its
  ARM token (Microsoft identity platform access token claims), and the store is ARM;
- locally, the caller is ``UPWELL_PRINCIPAL`` (else the login name) and the store is
  ``UPWELL_ACCESS_FILE``; without that file nobody was granted anything, and the stack's one user operates it.
Storage enforces the same conditions on Azure; this check gives the named error before the write.
"""

from __future__ import annotations

import base64
import getpass
import json
from pathlib import Path
from typing import Any

from upwell.access import conditions, grammar
from upwell.access.assignments import ArmAssignments, Assignment, FileAssignments
from upwell.access.roles import DATA_ACTIONS, OWNER, Role
from upwell.errors import ConfigError, NotOperator

ARM_SCOPE = "https://management.azure.com/.default"


def open_store(settings: Any, *, credential: Any = None, client_kwargs: dict | None = None):
    """ARM at ``settings.access_scope`` when it is set, else the local file."""
    scope = settings.access_scope
    if not scope:
        return FileAssignments(Path(settings.access_file))
    parts = scope.strip("/").split("/")
    if len(parts) < 2 or parts[0].lower() != "subscriptions":
        raise ConfigError(f"UPWELL_ACCESS_SCOPE must be a resource id (/subscriptions/<id>/...), got {scope!r}")
    if credential is None:
        from azure.identity import DefaultAzureCredential

        credential = DefaultAzureCredential()
    return ArmAssignments(scope, subscription_id=parts[1], credential=credential, client_kwargs=client_kwargs)


def current_principal(settings: Any, store: Any) -> str:
    """The caller: the token's object id on Azure, else UPWELL_PRINCIPAL or the login name."""
    if isinstance(store, ArmAssignments):
        token = store.credential.get_token(ARM_SCOPE).token
        payload = token.split(".")[1] if token.count(".") == 2 else ""
        try:
            claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        except ValueError:
            raise ConfigError("the signed-in identity's token carries no object id (oid)") from None
        return str(claims.get("oid") or "")
    return settings.principal or getpass.getuser()


def may_write(assignments: list[Assignment], path: str) -> bool:
    """Whether any assignment allows writing blob ``<container>/<name>``: its role holds the write data
    action, its scope covers the container, and its condition (if any) lets the write through."""
    container, _, name = path.partition("/")
    request = grammar.Request(f"{conditions.BLOBS}/write", attributes={
        ("Resource", conditions.CONTAINER_NAME): container, ("Resource", conditions.BLOB_PATH): name})
    for a in assignments:
        actions = DATA_ACTIONS.get(a.role_definition, DATA_ACTIONS[OWNER])
        if request.action not in actions or not _covers(a.scope, container):
            continue
        if not a.condition or grammar.evaluate(grammar.parse(a.condition), request):
            return True
    return False


def _covers(scope: str, container: str) -> bool:
    """An assignment at or above the account, or on this container (.../blobServices/default/containers/c)."""
    lowered = scope.lower().rstrip("/")
    return "/blobservices/" not in lowered or lowered.endswith(f"/containers/{container.lower()}")


def require_operator(settings: Any, path: str, *, store: Any = None) -> str:
    """The caller's name when they may write ``path`` (a payload definition or a pipeline rule); else
    NotOperator, naming the caller and the role they need."""
    store = store or open_store(settings)
    who = current_principal(settings, store)
    if isinstance(store, FileAssignments) and not store.exists():
        return who  # no roles were ever granted on this local stack: its one user operates it
    if may_write(store.list(principal=who), path):
        return who
    raise NotOperator(f"{who} may not register {path}: it needs the {Role.OPERATOR.value} role "
                      f"(upwell access grant {who} --project <P> --role {Role.OPERATOR.value})", code="NotOperator")

