"""Finds the Azure SDK calls in production code, for tests/unit/test_roles.py.

A call counts when its method is an operation of an installed Azure SDK client:
- management (ARM) clients: ``<x>.<group>.<method>(...)`` where ``group`` is an
  operation group of ComputeManagementClient, NetworkManagementClient,
  ResourceManagementClient or ContainerInstanceManagementClient (the attributes
  a built client holds);
  the call is named ``<group>.<method>``;
- data-plane clients (BatchClient, the blob, queue and table clients): a method
  of one of those classes called on a receiver that names a client (blob,
  container, queue, table or client: ``self.blob(c, n).upload_blob``,
  ``self.client.get_pool``), named by the method alone; a receiver such as
  ``self.ledger`` or a path is ours, not the SDK's;
- ``arm_put`` (upwell.pools.azure_common): a raw ARM PUT.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from functools import lru_cache
from pathlib import Path

MGMT = (("azure.mgmt.compute", "ComputeManagementClient"), ("azure.mgmt.network", "NetworkManagementClient"),
        ("azure.mgmt.resource.resources", "ResourceManagementClient"),
        ("azure.mgmt.containerinstance", "ContainerInstanceManagementClient"))
DATA = (("azure.batch", "BatchClient"), ("azure.storage.blob", "BlobClient"),
        ("azure.storage.blob", "ContainerClient"), ("azure.storage.blob", "BlobServiceClient"),
        ("azure.storage.queue", "QueueClient"), ("azure.storage.queue", "QueueServiceClient"),
        ("azure.data.tables", "TableClient"), ("azure.data.tables", "TableServiceClient"),
        ("azure.eventgrid", "EventGridPublisherClient"), ("azure.keyvault.secrets", "SecretClient"))
# Methods that make no request (client factories, plumbing).
LOCAL = {"close", "send_request", "from_connection_string", "from_blob_url", "from_container_url",
         "from_queue_url", "from_table_url", "api_version", "url", "primary_endpoint", "primary_hostname"}
CLIENTISH = re.compile(r"blob|container|queue|table|client", re.I)
RAW = {"arm_put"}


def _public(cls: type) -> set[str]:
    return {n for n, _ in inspect.getmembers(cls, callable) if not n.startswith("_")}


class _NoCredential:
    """Enough of a credential to build a client; no request is ever sent."""

    def get_token(self, *scopes, **kwargs):
        raise RuntimeError("the role scan never calls Azure")


@lru_cache(maxsize=1)
def mgmt_groups() -> dict[str, set[str]]:
    """Operation group attribute -> its public methods, read off built clients (attributes are set in
    each client's __init__, so their names come from the SDK, not from a rule)."""
    groups: dict[str, set[str]] = {}
    for module, name in MGMT:
        client = getattr(importlib.import_module(module), name)(_NoCredential(), "00000000")
        for attr, ops in vars(client).items():
            if type(ops).__name__.endswith("Operations"):
                groups.setdefault(attr, set()).update(_public(type(ops)))
    return groups


@lru_cache(maxsize=1)
def data_methods() -> set[str]:
    out: set[str] = set()
    for module, name in DATA:
        out |= _public(getattr(importlib.import_module(module), name))
    return {m for m in out if m not in LOCAL and not re.match(r"get_\w+_client$", m)}


def _call_name(node: ast.Call) -> str | None:
    func = node.func
    if isinstance(func, ast.Name) and func.id in RAW:
        return func.id
    if not isinstance(func, ast.Attribute):
        return None
    method, receiver = func.attr, func.value
    if method in RAW:
        return method
    if isinstance(receiver, ast.Attribute) and method in mgmt_groups().get(receiver.attr, ()):
        return f"{receiver.attr}.{method}"
    if method in data_methods() and CLIENTISH.search(ast.unparse(receiver)):
        return method
    return None


def calls_in(source: str) -> set[str]:
    """The SDK calls one module's source makes."""
    return {name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
            for name in [_call_name(node)] if name}


def scan(root: Path, globs: tuple[str, ...]) -> set[tuple[str, str]]:
    """(module path, call) for every SDK call under root's globs."""
    out: set[tuple[str, str]] = set()
    for pattern in globs:
        for path in sorted(root.glob(pattern)):
            rel = path.relative_to(root).as_posix()
            out |= {(rel, call) for call in calls_in(path.read_text(encoding="utf-8"))}
    return out
