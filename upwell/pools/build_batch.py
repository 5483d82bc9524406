"""Pure request builders for the Azure Batch backend: no I/O, tested on their own.

The pool is created through ARM (Microsoft.Batch/batchAccounts/pools), because
only ARM can give a pool a user-assigned managed identity; the data plane
(azure-batch 15.x ``BatchClient``) resizes it, removes nodes and lists them.

Options read here (``UPWELL_POOLS.<pool>.options``): ``image`` (required),
``registry``, ``identity_id`` (the worker identity's ARM resource id; it pulls
the image and reaches storage), ``identity_client_id``, ``storage_account``,
``env``, ``subnet_id``, ``pool_id`` (default ``upwell-<pool>``),
``image_reference`` ({publisher, offer, sku, version}), ``node_agent_sku``,
``container_run_options`` (``--gpus`` is dropped: Batch adds the GPUs itself),
``image_uid``/``image_gid`` (the image's user, default 10001: workers/docker), ``mpi``
(bool: inter-node communication, one task slot per node), ``gangs`` (bool: a gang pool, see
``is_gang_pool``), ``resize_timeout_min``; for creating
the pool: ``subscription_id``, ``resource_group`` and ``account_name`` (default:
from ``account_url``).
"""

from __future__ import annotations

import re
import secrets
import shlex
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from upwell.cost import tags as ops_tags
from upwell.errors import ConfigError
from upwell.pools import azure_common as az
from upwell.pools.base import PoolSpec

POOL_API_VERSION = "2024-07-01"  # Microsoft.Batch ARM API for batchAccounts/pools
# A Batch-supported Linux image with Docker-compatible runtime and GPU drivers.
DEFAULT_IMAGE_REFERENCE = {"publisher": "microsoft-dsvm", "offer": "ubuntu-hpc", "sku": "2204", "version": "latest"}
DEFAULT_NODE_AGENT = "batch.node.ubuntu 22.04"
DEALLOCATION = "taskcompletion"  # scale-in waits for running tasks; never requeues or kills them
# The worker images' user (workers/docker/Dockerfile.*: uid 10001, owner of /scratch). On Linux Batch runs a
# container task as the task's user, mapping its uid/gid into the container ("Run container applications on
# Azure Batch": "Batch will map the user/group permission to the container"); the pool's autoUser has a uid of
# the node's choosing, which does not own /scratch. So the pool declares a named user account with the image
# user's uid/gid (ARM UserAccount.linuxUserConfiguration) and the start task runs as it (userIdentity.userName).
AGENT_USER = "upwell"
IMAGE_UID = IMAGE_GID = 10001
SCRATCH = "/scratch"


def pool_id(spec: PoolSpec) -> str:
    return str(spec.options.get("pool_id") or f"upwell-{spec.name}")


def is_gang_pool(spec: PoolSpec) -> bool:
    """A gang pool (``options.gangs``) runs every agent as a Batch task, a shard of k > 1 nodes as a
    multi-instance task of k (upwell.pools.build_batch_tasks); its nodes have no start-task agent, so
    that Batch, which schedules the tasks, is the only one to hand out a node's one task slot."""
    return bool(spec.options.get("gangs", False))


def is_mpi(spec: PoolSpec) -> bool:
    """Inter-node communication and one task slot per node: an MPI pool, and every gang pool ("Multi-instance
    tasks require a pool with inter-node communication enabled, and with concurrent task execution disabled",
    Use multi-instance tasks to run MPI applications in Batch)."""
    return is_gang_pool(spec) or bool(spec.options.get("mpi", spec.name == "mpi"))


# VM sizes with InfiniBand (RDMA) among those upwell's MPI pools use: HB (HB120rs_v3, HB176rs_v4), HC (HC44rs)
# and the r-suffixed ND/NC sizes. Their MPI needs the HPC marketplace images (IB drivers, HPC-X, Intel MPI).
_INFINIBAND = re.compile(r"^standard_(hb|hc)\d|^standard_n[cd]\d+\w*r", re.I)
HPC_OFFERS = ("ubuntu-hpc", "almalinux-hpc")  # publisher microsoft-dsvm


def has_infiniband(vm_size: str) -> bool:
    return bool(_INFINIBAND.search(vm_size or ""))


def image_reference(spec: PoolSpec) -> dict[str, Any]:
    """The node image: ``options.image_reference``, else the Ubuntu HPC image. A gang pool on an InfiniBand
    size must keep an HPC image (microsoft-dsvm ubuntu-hpc / almalinux-hpc: IB drivers, HPC-X and Intel MPI);
    another image there is a ConfigError naming the option."""
    ref = dict(spec.options.get("image_reference") or DEFAULT_IMAGE_REFERENCE)
    if is_gang_pool(spec) and has_infiniband(spec.vm_size) and str(ref.get("offer", "")).lower() not in HPC_OFFERS:
        raise ConfigError(f"UPWELL_POOLS.{spec.name}.options.image_reference: a gang pool on {spec.vm_size} "
                          f"(InfiniBand) needs an HPC image (microsoft-dsvm, offer one of {', '.join(HPC_OFFERS)}), "
                          f"not offer {ref.get('offer')!r}")
    return ref


def run_options(spec: PoolSpec) -> str:
    """docker run options for the agent: host networking (MPI, IMDS). Never ``--gpus``: on GPU hardware
    "Batch will automatically enable GPU for container tasks, so you shouldn't include the --gpus
    argument" (Run container applications on Azure Batch); a given option's ``--gpus`` is dropped."""
    words = shlex.split(str(spec.options.get("container_run_options") or "--rm --network host"))
    kept, skip = [], False
    for word in words:
        if skip or word.startswith("--gpus="):
            skip = False
            continue
        if word == "--gpus":
            skip = True  # and its value
            continue
        kept.append(word)
    return shlex.join(kept)


def user_account(spec: PoolSpec) -> dict[str, Any]:
    """ARM UserAccount for the image's user. The password is required by the API and never used (no
    login is configured): a fresh random one, kept nowhere."""
    uid = int(spec.options.get("image_uid", IMAGE_UID))
    gid = int(spec.options.get("image_gid", spec.options.get("image_uid", IMAGE_GID)))
    return {"name": AGENT_USER, "password": secrets.token_urlsafe(24) + "-Aa1", "elevationLevel": "NonAdmin",
            "linuxUserConfiguration": {"uid": uid, "gid": gid}}


def start_task_command(spec: PoolSpec) -> str:
    """The agent, with UPWELL_NODE_SPOT set from Batch's own AZ_BATCH_NODE_IS_DEDICATED."""
    agent = " ".join(shlex.quote(a) for a in az.agent_command(spec))
    return ("/bin/sh -c 'if [ \"$AZ_BATCH_NODE_IS_DEDICATED\" = true ]; then export UPWELL_NODE_SPOT=0; "
            f"else export UPWELL_NODE_SPOT=1; fi; exec {agent}'")


def _registry(spec: PoolSpec) -> dict[str, Any] | None:
    server = az.registry_server(spec)
    if not server:
        return None
    reg: dict[str, Any] = {"registryServer": server}
    if spec.options.get("identity_id"):
        reg["identityReference"] = {"resourceId": str(spec.options["identity_id"])}
    return reg


def container_settings(spec: PoolSpec, working_directory: str) -> dict[str, Any]:
    """A task's containerSettings: the pool's image, run options and registry (ARM spells the working
    directory ``TaskWorkingDirectory``, the data plane ``taskWorkingDirectory``)."""
    settings: dict[str, Any] = {"imageName": az.image(spec), "containerRunOptions": run_options(spec),
                                "workingDirectory": working_directory}
    registry = _registry(spec)
    if registry:
        settings["registry"] = registry
    return settings


def agent_env(spec: PoolSpec, **extra: str) -> list[dict[str, str]]:
    """The agent's environmentSettings on a Batch node: watch Scheduled Events, the image's /scratch (writable
    by its user), and ``extra``."""
    env = az.agent_env(spec, **az.AZURE_VM_ENV, UPWELL_SCRATCH=SCRATCH, **extra)
    return [{"name": k, "value": v} for k, v in sorted(env.items())]


def start_task(spec: PoolSpec) -> dict[str, Any]:
    """ARM startTask: runs the agent container for the node's life (waitForSuccess false)."""
    return {
        "commandLine": start_task_command(spec),
        "containerSettings": container_settings(spec, "TaskWorkingDirectory"),
        "environmentSettings": agent_env(spec),
        "userIdentity": {"userName": AGENT_USER},  # the image's user (user_account): /scratch is its own
        "maxTaskRetryCount": 3,
        "waitForSuccess": False,
    }


def pool_body(spec: PoolSpec) -> dict[str, Any]:
    """The ARM body of Microsoft.Batch/batchAccounts/pools/<pool_id> (api POOL_API_VERSION). A gang pool has
    no start task: its agents are Batch tasks (``is_gang_pool``)."""
    vm_config: dict[str, Any] = {
        "imageReference": image_reference(spec),
        "nodeAgentSkuId": str(spec.options.get("node_agent_sku") or DEFAULT_NODE_AGENT),
        "containerConfiguration": {"type": "DockerCompatible", "containerImageNames": [az.image(spec)]},
    }
    registry = _registry(spec)
    if registry:
        vm_config["containerConfiguration"]["containerRegistries"] = [registry]
    props: dict[str, Any] = {
        "displayName": f"upwell {spec.name}",
        "vmSize": spec.vm_size,
        "deploymentConfiguration": {"virtualMachineConfiguration": vm_config},
        "scaleSettings": {"fixedScale": {"targetDedicatedNodes": 0, "targetLowPriorityNodes": 0,
                                         "resizeTimeout": _iso_minutes(resize_timeout(spec)),
                                         "nodeDeallocationOption": "TaskCompletion"}},
        "interNodeCommunication": "Enabled" if is_mpi(spec) else "Disabled",
        "taskSlotsPerNode": 1 if is_mpi(spec) else max(spec.tasks_per_node, 1),
        "taskSchedulingPolicy": {"nodeFillType": "Pack"},
        "userAccounts": [user_account(spec)],
        "metadata": ops_tags.metadata(az.tags(spec)),
        # Batch copies these onto the VMs, disks and NICs it makes (user-subscription accounts).
        "resourceTags": az.tags(spec),
    }
    if not is_gang_pool(spec):
        props["startTask"] = start_task(spec)
    if spec.options.get("subnet_id"):
        props["networkConfiguration"] = {"subnetId": str(spec.options["subnet_id"])}
    body: dict[str, Any] = {"properties": props}
    if spec.options.get("identity_id"):
        body["identity"] = {"type": "UserAssigned", "userAssignedIdentities": {str(spec.options["identity_id"]): {}}}
    return body


def pool_path(spec: PoolSpec) -> str:
    sub, rg = az.opt(spec, "subscription_id"), az.opt(spec, "resource_group")
    account = spec.options.get("account_name") or account_name(str(spec.options.get("account_url") or ""))
    if not account:
        az.opt(spec, "account_name")  # raises, naming the setting
    return (f"/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Batch/batchAccounts/{account}"
            f"/pools/{pool_id(spec)}")


def account_name(account_url: str) -> str:
    """"https://acct.eastus.batch.azure.com" -> "acct"."""
    host = urlsplit(account_url).hostname or ""
    return host.split(".", 1)[0] if host.endswith(".batch.azure.com") else ""


def resize_timeout(spec: PoolSpec) -> timedelta:
    return timedelta(minutes=float(spec.options.get("resize_timeout_min", 15)))


def resize_options(spec: PoolSpec, dedicated: int, spot: int):
    """Data-plane resize: targets for dedicated and spot (low-priority) nodes; taskcompletion."""
    from azure.batch import models as m

    return m.BatchPoolResizeOptions(target_dedicated_nodes=max(dedicated, 0), target_low_priority_nodes=max(spot, 0),
                                    resize_timeout=resize_timeout(spec), node_deallocation_option=DEALLOCATION)


def remove_options(spec: PoolSpec, node_ids: list[str], option: str = DEALLOCATION):
    """Data-plane remove-nodes for specific nodes (at most 100 a request). ``option`` is Batch's
    nodeDeallocationOption: ``taskcompletion`` for idle or drained nodes, ``terminate`` for a dead agent's node
    (its Batch tasks end and do not run again; the work item's lease comes back through visibility)."""
    from azure.batch import models as m

    if not node_ids or len(node_ids) > 100:
        raise ValueError(f"remove 1..100 nodes a request, not {len(node_ids)}")
    return m.BatchNodeRemoveOptions(node_ids=list(node_ids), resize_timeout=resize_timeout(spec),
                                    node_deallocation_option=option)


def batch_job_id(job_id: str) -> str:
    """A Batch job id for an upwell job: at most 64 of letters, digits, '-' and '_'."""
    return ("upwell-" + re.sub(r"[^A-Za-z0-9_-]", "-", job_id))[:64]


def _iso_minutes(td: timedelta) -> str:
    return f"PT{int(td.total_seconds() // 60)}M"
