"""What the Azure backends share: options, credentials, the agent's environment, raw ARM calls.

A backend reads its settings from ``PoolSpec.options`` (UPWELL_POOLS) through
``opt``, whose error names the setting. Credentials are azure-identity tokens;
there are no keys anywhere. The agent on a node finds its storage through the
identity-based connection settings (``AzureWebJobsStorage__accountName``,
``__credential=managedidentity``, ``__clientId``).
"""

from __future__ import annotations

import os
from typing import Any

from upwell import names
from upwell.errors import ConfigError
from upwell.pools.base import Busy, PoolSpec, WorkerPool, agent_slots

_REQUIRED = object()
ARM_SCOPE = "https://management.azure.com/.default"
ARM_URL = "https://management.azure.com"


def opt(spec: PoolSpec, key: str, default: Any = _REQUIRED) -> Any:
    """spec.options[key]; a missing required key raises ConfigError naming it."""
    value = spec.options.get(key)
    if value is None or value == "":
        if default is _REQUIRED:
            raise ConfigError(f"UPWELL_POOLS.{spec.name}.options.{key} is required for the "
                              f"{spec.backend} backend")
        return default
    return value


def credential(given: Any = None) -> Any:
    """The control-plane credential: the one given, else DefaultAzureCredential.

    On Azure the Function App's user-assigned identity is picked by AZURE_CLIENT_ID;
    on a workstation DefaultAzureCredential falls back to the developer's login.
    """
    if given is not None:
        return given
    from azure.identity import DefaultAzureCredential

    client_id = os.environ.get("AZURE_CLIENT_ID")
    return DefaultAzureCredential(managed_identity_client_id=client_id) if client_id else DefaultAzureCredential()


def image(spec: PoolSpec) -> str:
    """The pool's container image: options.payload names a built-in definition whose image (pinned by
    digest, with the agent inside: workers/docker/Dockerfile.gromacs) the nodes run; else options.image."""
    payload = spec.options.get("payload")
    if payload:
        from upwell.payloads.registry import builtins

        loaded = builtins().get(str(payload))
        if loaded is None:
            raise ConfigError(f"UPWELL_POOLS.{spec.name}.options.payload {payload!r} is not a built-in "
                              f"definition; known: {sorted(builtins())} (for a pushed one, set options.image "
                              "to its image)")
        return loaded.definition.image
    return str(opt(spec, "image"))


def registry_server(spec: PoolSpec) -> str:
    """The container registry of the worker image: options.registry, else the image's host."""
    explicit = spec.options.get("registry")
    if explicit:
        return str(explicit)
    ref = image(spec)
    if "/" not in ref:  # "worker:1" is a Docker Hub library image, not a registry host
        return ""
    host = ref.split("/", 1)[0]
    return host if "." in host or ":" in host or host == "localhost" else ""


def agent_command(spec: PoolSpec) -> list[str]:
    return ["python", "-m", "workers.agent", "--pool", spec.name]


# What an agent on an Azure VM (a Batch node, a VMSS instance) is told: watch Scheduled Events for its own
# VM (workers.eviction; IMDS at its default address). ACI container groups are no VMs and get no events.
AZURE_VM_ENV = {"UPWELL_EVICTION_WATCH": "1"}


def agent_env(spec: PoolSpec, **extra: str) -> dict[str, str]:
    """The agent's environment on a node: pool, size, identity-based storage, the image's digest when the
    image is pinned by one, and options.env."""
    env = {"UPWELL_POOL": spec.name, "UPWELL_VM_SIZE": spec.vm_size}
    slots = agent_slots(spec)
    if slots > 1:  # one agent per node runs this many shards at once (workers.agent)
        env["UPWELL_SLOTS"] = str(slots)
    client_id = spec.options.get("identity_client_id")
    if client_id:
        env["AZURE_CLIENT_ID"] = str(client_id)
    account = spec.options.get("storage_account")
    if account:
        env[f"{names.CONNECTION}__accountName"] = str(account)
        env[f"{names.CONNECTION}__credential"] = "managedidentity"
        if client_id:
            env[f"{names.CONNECTION}__clientId"] = str(client_id)
    image = str(spec.options.get("image") or "")
    if "@sha256:" in image:  # pinned at deploy (bicep/hooks/imagedigest.sh): results record what ran
        env["UPWELL_IMAGE_DIGEST"] = "sha256:" + image.rsplit("@sha256:", 1)[1]
    env.update({str(k): str(v) for k, v in (spec.options.get("env") or {}).items()})
    env.update({k: v for k, v in extra.items() if v is not None})
    return env


def tags(spec: PoolSpec) -> dict[str, str]:
    """Tags on every resource a backend creates (upwell.cost.tags); ``upwell-pool`` is how it finds its own."""
    from upwell.cost.tags import pool_tags

    return pool_tags(spec.name, spec.backend, spec.options)


def busy_set(busy: Busy) -> set[str] | None:
    """The busy node ids as a set; None when the caller could not tell."""
    if busy is None:
        return None
    return {str(n) for n in busy if n}


def arm_client(cred: Any, **client_kwargs: Any) -> Any:
    """An ARM pipeline client for calls the installed SDKs don't cover (Batch pools via ARM)."""
    from azure.core.pipeline import policies
    from azure.mgmt.core import ARMPipelineClient
    from azure.mgmt.core.policies import ARMChallengeAuthenticationPolicy, ARMHttpLoggingPolicy

    kw = dict(client_kwargs)
    base_url = kw.pop("base_url", ARM_URL)
    per_call = list(kw.pop("per_call_policies", []) or [])
    kw.pop("polling_interval", None)
    chain = per_call + [
        policies.RequestIdPolicy(**kw), policies.HeadersPolicy(**kw),
        policies.UserAgentPolicy(sdk_moniker="upwell", **kw), policies.ContentDecodePolicy(**kw),
        policies.RedirectPolicy(**kw), policies.RetryPolicy(**kw),
        ARMChallengeAuthenticationPolicy(cred, ARM_SCOPE, **kw), policies.NetworkTraceLoggingPolicy(**kw),
        ARMHttpLoggingPolicy(**kw)]
    return ARMPipelineClient(base_url=base_url, policies=chain)


def arm_put(client: Any, path: str, api_version: str, body: dict, *, polling_interval: float = 30.0) -> Any:
    """PUT an ARM resource and follow its long-running operation; returns the final JSON.

    Raises azure-core HttpResponseError on failure (pool_error() translates it in the backend).
    """
    from azure.core.exceptions import HttpResponseError
    from azure.core.polling import LROPoller
    from azure.core.rest import HttpRequest
    from azure.mgmt.core.polling.arm_polling import ARMPolling

    request = HttpRequest("PUT", client.format_url(f"{path}?api-version={api_version}"), json=body)
    pipeline_response = client.send_request(request, _return_pipeline_response=True)
    response = pipeline_response.http_response
    if response.status_code not in (200, 201, 202):
        response.read()
        raise HttpResponseError(response=response)
    if response.status_code == 200 and not response.headers.get("Azure-AsyncOperation"):
        return response.json() if response.content else {}

    def final(pipeline_response):
        body = pipeline_response.http_response
        return body.json() if body.content else {}

    poller = LROPoller(client, pipeline_response, final, ARMPolling(polling_interval))
    return poller.result()


class Pollers:
    """Long-running operations a backend started and did not wait for.

    ``check()`` collects the finished ones; a failure is kept (translated) as
    ``error`` until a later operation succeeds, and backends show it on
    PoolStatus.message: an allocation that failed minutes after the request
    (AllocationFailed, SkuNotAvailable) surfaces there.
    """

    def __init__(self, pool: str) -> None:
        self.pool = pool
        self.running: list[tuple[str, Any]] = []
        self.error: Any = None  # the last PoolError, or None

    def add(self, action: str, poller: Any) -> Any:
        self.running.append((action, poller))
        return poller

    def __iter__(self):
        return (p for _, p in self.running)

    def check(self) -> Any:
        from azure.core.exceptions import AzureError

        from upwell.pools.azure_errors import pool_error

        still = []
        for action, poller in self.running:
            if not poller.done():
                still.append((action, poller))
                continue
            try:
                poller.result(timeout=0)
                self.error = None
            except AzureError as exc:
                self.error = pool_error(exc, pool=self.pool, action=action)
        self.running = still
        return self.error


class ArmPool(WorkerPool):
    """A pool driven through one ARM management client (VMSS, ACI).

    Keeps the credential, the lazily built client, the client settings and the pending
    long-running operations. Subclasses name their SDK
    client in ``_client_class``.
    """

    def __init__(self, spec: PoolSpec, *, credential: Any = None, client: Any = None,
                 client_kwargs: dict | None = None):
        super().__init__(spec)
        self._credential = credential
        self._client = client
        self._kwargs = dict(client_kwargs or {})
        self.pollers = Pollers(spec.name)

    def _client_class(self) -> type:
        raise NotImplementedError

    @property
    def client(self):
        if self._client is None:
            self._client = self._client_class()(credential(self._credential), str(opt(self.spec, "subscription_id")),
                                                **self._kwargs)
        return self._client

    @property
    def rg(self) -> str:
        return str(opt(self.spec, "resource_group"))

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
