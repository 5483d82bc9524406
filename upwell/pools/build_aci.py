"""Pure request builders for the Container Instances backend: no I/O, tested on their own.

One container group is one worker: the agent container, restart policy Never,
so a group whose agent exited (idle for ``idle_exit_s``, or done) is finished
and is deleted at the next evaluation. Groups carry the pool's tags; the
``upwell-pool`` tag is how the backend finds its own.

Options read here: ``image`` (required), ``registry``, ``identity_id`` (pulls
the image from ACR and reaches storage), ``identity_client_id``,
``storage_account``, ``env``, ``tags``, ``location`` (required), ``subnet_id``,
``cpu`` (cores, default 1), ``memory_gb`` (default 1.5), ``gpu_count`` and
``gpu_sku`` (V100, P100 or K80), ``idle_exit_s`` (default 300), ``warm_idle_exit_s`` (the first
``min_nodes`` groups' agents; default 0, never).
"""

from __future__ import annotations

import re
import secrets

from upwell.errors import ConfigError
from upwell.pools import azure_common as az
from upwell.pools.base import PoolSpec, warm_idle_exit_s

GPU_SKUS = ("V100", "P100", "K80")
WARM_TAG = "upwell-warm"  # on a group whose agent keeps warm (one of the first min_nodes)


def group_name(spec: PoolSpec, suffix: str | None = None) -> str:
    """``upwell-<pool>-<8 hex>``: lower-case, at most 63 characters, as ACI wants."""
    suffix = suffix or secrets.token_hex(4)
    base = re.sub(r"[^a-z0-9-]", "-", f"upwell-{spec.name}".lower())[: 63 - len(suffix) - 1]
    return f"{base}-{suffix}"


def gpu(spec: PoolSpec) -> tuple[int, str] | None:
    count = int(spec.options.get("gpu_count") or 0)
    if count <= 0:
        return None
    sku = str(spec.options.get("gpu_sku") or "V100").upper()
    if sku not in GPU_SKUS:
        raise ConfigError(f"UPWELL_POOLS.{spec.name}.options.gpu_sku must be one of {list(GPU_SKUS)}, got {sku!r}")
    return count, sku


def container_group(spec: PoolSpec, name: str, *, spot: bool = False, warm: bool = False):
    """The ContainerGroup for one worker. Spot is not offered with GPUs, so GPU groups are Regular.
    ``warm``: one of the pool's first ``min_nodes`` groups, whose agent's idle exit is the warm one
    (``warm_idle_exit_s``, default 0: never), tagged ``upwell-warm`` so the pool counts it and deletes it
    last."""
    from azure.mgmt.containerinstance import models as m

    accel = gpu(spec)
    idle_s = warm_idle_exit_s(spec) if warm else float(spec.options.get("idle_exit_s", 300))
    idle_exit = str(int(idle_s))
    env = az.agent_env(spec, UPWELL_NODE_ID=name, UPWELL_NODE_SPOT="1" if spot and not accel else "0",
                       UPWELL_IDLE_EXIT_S=idle_exit)
    requests = m.ResourceRequests(memory_in_gb=float(spec.options.get("memory_gb", 1.5)),
                                  cpu=float(spec.options.get("cpu", 1)),
                                  gpu=m.GpuResource(count=accel[0], sku=accel[1]) if accel else None)
    container = m.Container(
        name="agent", image=az.image(spec), command=[*az.agent_command(spec), "--idle-exit", idle_exit],
        resources=m.ResourceRequirements(requests=requests),
        environment_variables=[m.EnvironmentVariable(name=k, value=v) for k, v in sorted(env.items())])
    identity_id = spec.options.get("identity_id")
    registry = az.registry_server(spec)
    return m.ContainerGroup(
        location=str(az.opt(spec, "location")), tags={**az.tags(spec), **({WARM_TAG: "1"} if warm else {})},
        containers=[container], os_type="Linux",
        restart_policy="Never", priority="Spot" if spot and not accel else "Regular",
        identity=m.ContainerGroupIdentity(type="UserAssigned", user_assigned_identities={
            str(identity_id): m.UserAssignedIdentities()}) if identity_id else None,
        image_registry_credentials=[m.ImageRegistryCredential(server=registry, identity=str(identity_id))]
        if registry and identity_id else None,
        subnet_ids=[m.ContainerGroupSubnetId(id=str(spec.options["subnet_id"]))]
        if spec.options.get("subnet_id") else None)


def group_state(group) -> str:
    """A container group's native state: provisioning while it says more, else the instance view's."""
    prov = str(getattr(group, "provisioning_state", "") or "").lower()
    if prov in ("creating", "pending", "accepted", "failed", "deleting", "canceled"):
        return prov
    view = getattr(group, "instance_view", None)
    state = str(getattr(view, "state", "") or "").lower()
    return state or ("creating" if prov in ("", "updating", "repairing") else "unknown")
