"""Pure request builders for the VM Scale Set backend: no I/O, tested on their own.

A pool is one Uniform scale set per priority: ``upwell-<pool>`` (Regular) and
``upwell-<pool>-spot`` (Spot, eviction policy Delete, max price -1: pay up to
the on-demand price, never evicted for price). Which of them exist follows
``spot_share`` (0: regular only, 1: spot only, between: both).

Each VM boots cloud-init that runs the agent container under systemd, told
(``azure_common.AZURE_VM_ENV``) to watch Scheduled Events itself
(``workers.eviction``): a Preempt (spot, ~30 s notice) or Terminate (scale-in,
with the scale set's terminate notification) that names this VM preempts its
payloads, which checkpoint, and their messages are released at once; events for
the set's other VMs change nothing.

Options read here: ``image`` (required), ``registry``, ``identity_id`` and
``identity_client_id`` (the worker identity: pulls from ACR, reaches storage),
``storage_account``, ``env``, ``tags``, ``location``, ``subnet_id`` (required to
create), ``ssh_public_key`` (required to create), ``admin_username``,
``os_image`` ({publisher, offer, sku, version}), ``gpu`` (bool),
``scale_set`` (base name), ``terminate_notice_min``.
"""

from __future__ import annotations

import base64
import json
import shlex
from typing import Any

from upwell.pools import azure_common as az
from upwell.pools.base import PoolSpec

# Ubuntu with Docker and, for GPU sizes, NVIDIA drivers and the container toolkit.
CPU_IMAGE = {"publisher": "Canonical", "offer": "ubuntu-24_04-lts", "sku": "server", "version": "latest"}
GPU_IMAGE = {"publisher": "microsoft-dsvm", "offer": "ubuntu-hpc", "sku": "2204", "version": "latest"}
IMDS = "http://169.254.169.254/metadata"
ACR_ANON_USER = "00000000-0000-0000-0000-000000000000"  # the user name ACR expects with a refresh token


def scale_set_name(spec: PoolSpec, spot: bool) -> str:
    base = str(spec.options.get("scale_set") or f"upwell-{spec.name}")
    return f"{base}-spot" if spot else base


def scale_sets(spec: PoolSpec) -> list[tuple[str, bool]]:
    """(name, spot) of the scale sets this pool uses, regular first."""
    share = spec.spot_share
    kinds = ([False] if share < 1 else []) + ([True] if share > 0 else [])
    return [(scale_set_name(spec, s), s) for s in kinds]


def agent_script(spec: PoolSpec, spot: bool) -> str:
    """The shell that logs in to the registry with the VM's identity and runs the agent."""
    registry = az.registry_server(spec)
    client_id = str(spec.options.get("identity_client_id") or "")
    gpu = " --gpus all" if spec.options.get("gpu") else ""
    agent = " ".join(shlex.quote(a) for a in az.agent_command(spec))
    login = ""
    if registry:
        token_url = (f"{IMDS}/identity/oauth2/token?api-version=2018-02-01&resource=https://management.azure.com/"
                     + (f"&client_id={client_id}" if client_id else ""))
        login = (
            f"TOKEN=$(curl -sf --noproxy '*' -H Metadata:true '{token_url}' | {_json_field('access_token')})\n"
            f"REFRESH=$(curl -sf -X POST -d \"grant_type=access_token&service={registry}&access_token=$TOKEN\" "
            f"'https://{registry}/oauth2/exchange' | {_json_field('refresh_token')})\n"
            f"echo \"$REFRESH\" | docker login -u {ACR_ANON_USER} --password-stdin {registry}\n")
    return (
        "#!/bin/sh\n"
        "# Runs the upwell agent container; systemd restarts it if it exits. IMDS is never reached through a proxy.\n"
        "set -eu\n"
        f"NAME=$(curl -sf --noproxy '*' -H Metadata:true "
        f"'{IMDS}/instance/compute/name?api-version=2021-02-01&format=text')\n"
        f"{login}"
        f"exec docker run --rm --name upwell-agent --network host{gpu} --env-file /etc/upwell/agent.env "
        f"-e UPWELL_NODE_ID=\"$NAME\" -e UPWELL_NODE_SPOT={int(spot)} {shlex.quote(az.image(spec))} {agent}\n")


def _json_field(name: str) -> str:
    return f"python3 -c 'import json,sys; print(json.load(sys.stdin)[\"{name}\"])'"


AGENT_UNIT = """[Unit]
Description=upwell agent
After=docker.service network-online.target
Wants=network-online.target
Requires=docker.service

[Service]
ExecStart=/usr/local/bin/upwell-agent
ExecStop=/usr/bin/docker stop -t 25 upwell-agent
Restart=always
RestartSec=10

[Install]
WantedBy=multi-user.target
"""

def cloud_init(spec: PoolSpec, spot: bool) -> str:
    """The #cloud-config document (text) for a VM of this pool."""
    env = "".join(f"{k}={v}\n" for k, v in sorted(az.agent_env(spec, **az.AZURE_VM_ENV).items()))
    files = [("/etc/upwell/agent.env", "0600", env), ("/usr/local/bin/upwell-agent", "0755", agent_script(spec, spot)),
             ("/etc/systemd/system/upwell-agent.service", "0644", AGENT_UNIT)]
    out = ["#cloud-config", "write_files:"]
    for path, mode, content in files:
        out += [f"  - path: {path}", f"    permissions: '{mode}'", "    content: |"]
        out += [f"      {line}" if line else "" for line in content.rstrip("\n").split("\n")]
    out += ["runcmd:",
            "  - [sh, -c, 'command -v docker >/dev/null || (apt-get update && apt-get install -y docker.io)']",
            "  - [systemctl, daemon-reload]",
            "  - [systemctl, enable, --now, upwell-agent.service]"]
    return "\n".join(out) + "\n"


def custom_data(spec: PoolSpec, spot: bool) -> str:
    """cloud-init, base64 encoded as osProfile.customData wants it."""
    return base64.b64encode(cloud_init(spec, spot).encode()).decode()


def scale_set(spec: PoolSpec, spot: bool, capacity: int = 0):
    """The VirtualMachineScaleSet to create for this pool and priority."""
    from azure.mgmt.compute import models as m

    user = str(spec.options.get("admin_username") or "upwell")
    image = dict(spec.options.get("os_image") or (GPU_IMAGE if spec.options.get("gpu") else CPU_IMAGE))
    profile = m.VirtualMachineScaleSetVMProfile(
        os_profile=m.VirtualMachineScaleSetOSProfile(
            computer_name_prefix=scale_set_name(spec, spot)[:58], admin_username=user,
            custom_data=custom_data(spec, spot),
            linux_configuration=m.LinuxConfiguration(
                disable_password_authentication=True,
                ssh=m.SshConfiguration(public_keys=[m.SshPublicKey(
                    path=f"/home/{user}/.ssh/authorized_keys", key_data=str(az.opt(spec, "ssh_public_key")))]))),
        storage_profile=m.VirtualMachineScaleSetStorageProfile(
            image_reference=m.ImageReference(**image),
            os_disk=m.VirtualMachineScaleSetOSDisk(
                create_option="FromImage", caching="ReadWrite", delete_option="Delete",
                managed_disk=m.VirtualMachineScaleSetManagedDiskParameters(storage_account_type="StandardSSD_LRS"))),
        network_profile=m.VirtualMachineScaleSetNetworkProfile(network_interface_configurations=[
            m.VirtualMachineScaleSetNetworkConfiguration(
                name="nic", properties=m.VirtualMachineScaleSetNetworkConfigurationProperties(
                    primary=True, ip_configurations=[m.VirtualMachineScaleSetIPConfiguration(
                        name="ip", properties=m.VirtualMachineScaleSetIPConfigurationProperties(
                            primary=True, subnet=m.ApiEntityReference(id=str(az.opt(spec, "subnet_id")))))]))]),
        scheduled_events_profile=m.ScheduledEventsProfile(terminate_notification_profile=m.TerminateNotificationProfile(
            enable=True, not_before_timeout=f"PT{int(spec.options.get('terminate_notice_min', 5))}M")),
        priority="Spot" if spot else "Regular",
        eviction_policy="Delete" if spot else None,
        billing_profile=m.BillingProfile(max_price=-1) if spot else None)
    identity = None
    if spec.options.get("identity_id"):
        identity = m.VirtualMachineScaleSetIdentity(type="UserAssigned", user_assigned_identities={
            str(spec.options["identity_id"]): m.UserAssignedIdentitiesValue()})
    return m.VirtualMachineScaleSet(
        location=str(az.opt(spec, "location")), tags=az.tags(spec), identity=identity,
        sku=m.Sku(name=spec.vm_size, tier="Standard", capacity=max(capacity, 0)),
        properties=m.VirtualMachineScaleSetProperties(
            orchestration_mode="Uniform", upgrade_policy=m.UpgradePolicy(mode="Manual"),
            # Overprovisioned extra VMs would start agents that are then deleted mid-task.
            overprovision=False, single_placement_group=False, virtual_machine_profile=profile))


def capacity_update(spec: PoolSpec, capacity: int):
    """PATCH body that only raises (or sets) the capacity."""
    from azure.mgmt.compute import models as m

    return m.VirtualMachineScaleSetUpdate(sku=m.Sku(name=spec.vm_size, tier="Standard", capacity=max(capacity, 0)))


def delete_instances(instance_ids: list[str]):
    from azure.mgmt.compute import models as m

    if not instance_ids:
        raise ValueError("no instances to delete")
    return m.VirtualMachineScaleSetVMInstanceRequiredIDs(instance_ids=[str(i) for i in instance_ids])


def vm_state(vm: Any) -> str:
    """A scale-set VM's native state: its provisioning state while that says more, else its power state."""
    prov = str(getattr(vm, "provisioning_state", "") or "").lower()
    if prov in ("creating", "deleting", "failed"):
        return prov
    view = getattr(vm, "instance_view", None)
    for status in (getattr(view, "statuses", None) or []):
        code = str(getattr(status, "code", "") or "")
        if code.startswith("PowerState/"):
            return code.split("/", 1)[1].lower()
    return "creating" if prov in ("", "updating") else "unknown"


def quota_free(usages: Any, family: str) -> int | None:
    """vCPUs still free in a quota family (``usage.list(location)`` rows), or None if not listed."""
    for row in usages:
        name = getattr(getattr(row, "name", None), "value", None)
        if name and name.lower() == family.lower():
            return max(int(row.limit) - int(row.current_value), 0)
    return None


def as_json(model: Any) -> dict:
    """A model as the JSON the SDK sends (for tests and logs)."""
    return json.loads(json.dumps(model.as_dict()))
