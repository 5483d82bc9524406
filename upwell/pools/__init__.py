"""Worker-pool backends: a closed set, as a plain dict of import paths.

A backend module is imported only when a pool asks for it, so the Azure SDK a
backend needs is imported only there (the local pool needs none).

``make_pool(spec, **ctx)`` builds the backend ``spec.backend`` names. ``ctx`` is
what the caller has to offer for every pool it may build; each backend gets the
keywords it declares in KEYWORDS, and a keyword that no backend declares (a typo)
raises ConfigError:

- local: ``state_dir``, ``idle_exit_s``, ``env`` (see upwell.pools.process);
- batch (also ``arm_client``), vmss, aci: ``credential`` (an azure-core TokenCredential; default
  DefaultAzureCredential, or ManagedIdentityCredential when
  ``spec.options["identity_client_id"]``/AZURE_CLIENT_ID names one), ``client``
  (a ready SDK client, e.g. for tests) and ``client_kwargs`` (passed to the SDK
  client: base_url, retry and polling settings, extra policies);
- slurm: ``state_dir``, ``idle_exit_s``, ``env`` (the Slurm commands' environment,
  e.g. SLURM_CONF) and ``client`` (a callable that runs a Slurm
  command; see upwell.pools.slurm).
"""

from __future__ import annotations

import importlib

from upwell.errors import ConfigError
from upwell.pools.base import NodeState, PoolSpec, PoolStatus, WorkerPool

POOLS: dict[str, str] = {
    "local": "upwell.pools.process:LocalPool",
    "batch": "upwell.pools.batch:BatchPool",
    "vmss": "upwell.pools.vmss:VmssPool",
    "aci": "upwell.pools.aci:AciPool",
    "slurm": "upwell.pools.slurm:SlurmPool",
}

# The keywords each backend's constructor takes (tests/integration/test_autoscaler.py checks them
# against the signatures).
KEYWORDS: dict[str, frozenset[str]] = {
    "local": frozenset({"state_dir", "idle_exit_s", "env"}),
    "batch": frozenset({"credential", "client", "arm_client", "client_kwargs"}),
    "vmss": frozenset({"credential", "client", "client_kwargs"}),
    "aci": frozenset({"credential", "client", "client_kwargs"}),
    "slurm": frozenset({"state_dir", "idle_exit_s", "env", "client"}),
}

__all__ = ["KEYWORDS", "POOLS", "NodeState", "PoolSpec", "PoolStatus", "WorkerPool", "backend_class", "make_pool"]


def backend_class(backend: str) -> type[WorkerPool]:
    """The WorkerPool subclass registered for ``backend``; its module is imported now."""
    try:
        path = POOLS[backend]
    except KeyError:
        raise ConfigError(f"pool backend {backend!r} is not known; known: {sorted(POOLS)}") from None
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and not module_name.startswith(exc.name):
            raise ConfigError(f"pool backend {backend!r} needs the package {exc.name!r}; install it "
                              f"to use this backend") from None
        raise
    return getattr(module, attr)


def make_pool(spec: PoolSpec, **ctx) -> WorkerPool:
    """Build the pool ``spec.backend`` names. See the module docstring for ``ctx``."""
    known = frozenset().union(*KEYWORDS.values())
    unknown = sorted(set(ctx) - known)
    if unknown:
        raise ConfigError(f"pool keywords {unknown} are not known to any backend; known: {sorted(known)}")
    cls = backend_class(spec.backend)
    return cls(spec, **{k: v for k, v in ctx.items() if k in KEYWORDS.get(spec.backend, frozenset())})
