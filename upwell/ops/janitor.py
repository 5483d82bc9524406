"""The janitor: finds leaked, idle, expired and overdue resources, and (with apply) acts on them.

What it finds, in one resource group and one Batch account:

- ``unattached_disk``, ``unattached_nic``, ``unattached_ip``: managed disks, NICs and public IPs
  that nothing uses (they bill on their own);
- ``stopped_vm``: VMs stopped but not deallocated (they still bill for compute);
- ``idle_scale_set``, ``idle_batch_pool``: pools with nodes but no work for ``idle_minutes``;
- ``orphan_batch_job``: Batch jobs still active after their upwell job finished (they hold the
  account's job quota);
- ``expired``: anything whose ``upwell-expires`` date has passed;
- ``overdue_job``: upwell jobs past their max wall-clock (the kill switch);
- ``over_budget``: upwell jobs still running whose owner or project has spent past its budget for
  the window (``UPWELL_BUDGETS``; ingest refuses a job whose estimate would pass it, and this
  stops the ones that passed it while they ran).

A scan only reads. ``apply`` acts as the policy says for each kind (delete, deallocate,
scale_to_zero, terminate, kill or report) and only on resources carrying upwell's tags,
unless the policy's ``include_untagged`` says otherwise. Every finding, acted on or not, is
recorded (``record``) in Table ``janitor``. State kept: the policy, the SDK clients, the
ledger and the pool-activity source.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from upwell import logs
from upwell.cost import tags as T
from upwell.cost import wallclock
from upwell.errors import ConfigError
from upwell.ops.findings import Finding, FindingsLog
from upwell.rows import JobState
from upwell.timeutil import now_iso

log = logs.get("upwell.ops.janitor")

ACTIONS = ("delete", "deallocate", "scale_to_zero", "terminate", "kill", "report")
DEFAULT_ACTIONS = {"unattached_disk": "delete", "unattached_nic": "delete", "unattached_ip": "delete",
                   "stopped_vm": "deallocate", "idle_scale_set": "scale_to_zero", "idle_batch_pool": "scale_to_zero",
                   "orphan_batch_job": "terminate", "expired": "delete", "overdue_job": "kill", "over_budget": "kill"}
# API versions for deleting an expired resource by id: the types the janitor's role may delete.
DELETE_API = {"microsoft.compute/disks": "2024-03-02", "microsoft.compute/snapshots": "2024-03-02",
              "microsoft.compute/virtualmachines": "2024-07-01",
              "microsoft.compute/virtualmachinescalesets": "2024-07-01",
              "microsoft.network/networkinterfaces": "2024-05-01",
              "microsoft.network/publicipaddresses": "2024-05-01",
              "microsoft.containerinstance/containergroups": "2023-05-01"}
TERMINAL = ("succeeded", "partially_failed", "failed", "rejected")


@dataclass(frozen=True)
class Policy:
    """What to do per kind of finding; read from a YAML or JSON file (every key optional)."""

    actions: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_ACTIONS))
    idle_minutes: float = 60.0
    include_untagged: bool = False

    @classmethod
    def load(cls, path: str | Path | None = None) -> Policy:
        if not path:
            return cls()
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        actions = {**DEFAULT_ACTIONS, **(doc.get("actions") or {})}
        bad = {k: v for k, v in actions.items() if k not in DEFAULT_ACTIONS or v not in ACTIONS}
        if bad:
            raise ConfigError(f"janitor policy {path}: unknown kinds or actions {bad}; kinds "
                              f"{sorted(DEFAULT_ACTIONS)}, actions {list(ACTIONS)}")
        return cls(actions=actions, idle_minutes=float(doc.get("idle_minutes", 60.0)),
                   include_untagged=bool(doc.get("include_untagged", False)))


def _prop(obj: Any, name: str) -> Any:
    """A model attribute, flattened (older SDK models) or under ``properties`` (newer ones)."""
    value = getattr(obj, name, None)
    if value is None:
        value = getattr(getattr(obj, "properties", None), name, None)
    return getattr(value, "value", value)  # enums: their wire value


def _tags(obj: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in (getattr(obj, "tags", None) or {}).items()}


class Janitor:
    """Scans and acts. Clients are the real SDK ones (built lazily, or given for tests); the open jobs are
    read once per scan."""

    def __init__(self, policy: Policy | None = None, *, subscription_id: str = "", resource_group: str = "",
                 batch_url: str = "", credential: Any = None, client_kwargs: dict | None = None,
                 ledger: Any = None, pool_active: Callable[[str, float], bool] | None = None,
                 now: datetime | None = None, budgets: Mapping[str, Mapping[str, float]] | None = None,
                 budget_window_days: float = 30.0):
        self.policy = policy or Policy()
        self.sub, self.rg, self.batch_url = subscription_id, resource_group, batch_url
        self._credential = credential
        self._kwargs = dict(client_kwargs or {})
        self.ledger = ledger
        self.pool_active = pool_active or (lambda pool, minutes: True)  # unknown activity: never idle
        self.now = now or datetime.now(UTC)
        self.budgets, self.budget_window_days = dict(budgets or {}), float(budget_window_days)
        self._clients: dict[str, Any] = {}
        self._open: list | None = None  # the open jobs, read once per scan (``_running``)

    # -- clients ----------------------------------------------------------------------
    def _cred(self):
        from upwell.pools.azure_common import credential

        self._credential = credential(self._credential)
        return self._credential

    def client(self, which: str):
        if which not in self._clients:
            if which == "batch":
                from azure.batch import BatchClient

                kw = {k: (list(v) if isinstance(v, list) else v) for k, v in self._kwargs.items()
                      if k not in ("base_url", "polling_interval")}  # the client appends to the policy list
                self._clients[which] = BatchClient(endpoint=self.batch_url, credential=self._cred(), **kw)
            else:
                cls = {"compute": "azure.mgmt.compute:ComputeManagementClient",
                       "network": "azure.mgmt.network:NetworkManagementClient",
                       "resources": "azure.mgmt.resource.resources:ResourceManagementClient"}[which]
                module, name = cls.split(":")
                import importlib

                kw = {k: (list(v) if isinstance(v, list) else v) for k, v in self._kwargs.items()}
                self._clients[which] = getattr(importlib.import_module(module), name)(self._cred(), self.sub, **kw)
        return self._clients[which]

    @property
    def arm(self) -> bool:
        return bool(self.sub and self.rg)

    # -- scan ---------------------------------------------------------------------------
    def scan(self) -> list[Finding]:
        """Every finding, each with the action the policy plans for it. A scanner that fails is
        logged and skipped: one broken API never hides the other leaks."""
        scanners = [self._overdue, self._over_budget]
        self._open = None
        if self.arm:
            scanners += [self._disks, self._nics, self._ips, self._vms, self._scale_sets, self._expired]
        if self.batch_url:
            scanners += [self._batch_pools, self._batch_jobs]
        found: list[Finding] = []
        for scanner in scanners:
            try:
                for f in scanner(found):
                    f.action = self.policy.actions.get(f.kind, "report")
                    found.append(f)
            except Exception as exc:  # noqa: BLE001 - a periodic loop logs and goes on
                log.warning("janitor.scan_failed", scanner=scanner.__name__.strip("_"), error=str(exc)[:300])
        return found

    def _finding(self, kind: str, obj: Any, reason: str, tags: dict | None = None) -> Finding:
        tags = _tags(obj) if tags is None else tags
        return Finding(kind, str(getattr(obj, "id", "") or getattr(obj, "name", "")), str(getattr(obj, "name", "")),
                       reason, T.is_upwell(tags), tags=tags)

    def _disks(self, _found):
        for d in self.client("compute").disks.list_by_resource_group(self.rg):
            if str(_prop(d, "disk_state") or "").lower() == "unattached" and not d.managed_by:
                yield self._finding("unattached_disk", d, f"managed disk ({_prop(d, 'disk_size_gb')} GiB) attached "
                                    "to nothing")

    def _nics(self, _found):
        for nic in self.client("network").network_interfaces.list(self.rg):
            if _prop(nic, "virtual_machine") is None and _prop(nic, "private_endpoint") is None:
                yield self._finding("unattached_nic", nic, "network interface attached to no VM")

    def _ips(self, _found):
        for ip in self.client("network").public_ip_addresses.list(self.rg):
            if _prop(ip, "ip_configuration") is None and _prop(ip, "nat_gateway") is None:
                yield self._finding("unattached_ip", ip, f"public IP {_prop(ip, 'ip_address') or ''} associated "
                                    "with nothing")

    def _vms(self, _found):
        compute = self.client("compute")
        for vm in compute.virtual_machines.list(self.rg):
            view = compute.virtual_machines.instance_view(self.rg, vm.name)
            power = [s.code for s in (view.statuses or []) if str(s.code).startswith("PowerState/")]
            if power and power[0].lower() == "powerstate/stopped":
                yield self._finding("stopped_vm", vm, "VM stopped but not deallocated: its compute still bills")

    def _scale_sets(self, _found):
        for ss in self.client("compute").virtual_machine_scale_sets.list(self.rg):
            tags, capacity = _tags(ss), int(getattr(ss.sku, "capacity", 0) or 0)
            pool = tags.get(T.POOL)
            if pool and capacity > 0 and not self.pool_active(pool, self.policy.idle_minutes):
                yield self._finding("idle_scale_set", ss, f"{capacity} VM(s) and no work on pool {pool!r} for "
                                    f"{self.policy.idle_minutes:g} min")

    def _expired(self, found):
        seen = {f.resource.lower() for f in found}
        for res in self.client("resources").resources.list_by_resource_group(self.rg):
            tags = _tags(res)
            if T.expired(tags, self.now.date()) and str(res.id).lower() not in seen:
                yield self._finding("expired", res, f"{res.type} past upwell-expires {tags[T.EXPIRES]}")

    def _batch_pools(self, _found):
        for pool in self.client("batch").list_pools():
            tags = T.from_metadata(pool.metadata)
            nodes = int(pool.target_dedicated_nodes or 0) + int(pool.target_low_priority_nodes or 0)
            name = tags.get(T.POOL)
            if name and nodes > 0 and not self.pool_active(name, self.policy.idle_minutes):
                yield Finding("idle_batch_pool", pool.id, pool.id, f"{nodes} node(s) and no work on pool {name!r} "
                              f"for {self.policy.idle_minutes:g} min", True, tags=tags)
            elif T.expired(tags, self.now.date()):
                yield Finding("expired", pool.id, pool.id, f"Batch pool past upwell-expires {tags[T.EXPIRES]}",
                              True, tags=tags)

    def _batch_jobs(self, _found):
        for job in self.client("batch").list_jobs(filter="state eq 'active'"):
            tags = T.from_metadata(job.metadata)
            upwell_job = tags.get(T.JOB)
            if not upwell_job or self.ledger is None:
                continue
            row = self.ledger.job(upwell_job)
            if row is None or row.status in TERMINAL:
                yield Finding("orphan_batch_job", job.id, job.id, f"Batch job active, but upwell job {upwell_job} is "
                              f"{row.status.value if row else 'gone'}", True, tags=tags)

    def _overdue(self, _found):
        if self.ledger is None:
            return
        for job in self._running():
            if job.killed_at:
                continue
            why = wallclock.job_overdue(job, self.now)
            if why:
                yield Finding("overdue_job", job.job_id, job.name or job.job_id, why,
                              True, tags={T.JOB: job.job_id, T.OWNER: job.owner, T.PROJECT: job.project})

    def _over_budget(self, found):
        if self.ledger is None or not self.budgets:
            return
        from datetime import timedelta

        from upwell.cost.budgets import spent

        since = self.now - timedelta(days=self.budget_window_days)
        killed = {f.resource for f in found}
        running = [j for j in self._running() if not j.killed_at]
        for by in ("owner", "project"):
            for value, budget in (self.budgets.get(by) or {}).items():
                jobs = [j for j in running if getattr(j, by) == value and j.job_id not in killed]
                used = spent(self.ledger, by, value, since) if jobs else 0.0
                if used <= budget:
                    continue
                why = (f"killed: {by} {value!r} has spent ${used:,.4f} of a ${budget:,.4f} budget in the last "
                       f"{self.budget_window_days:g} days")
                for job in jobs:
                    killed.add(job.job_id)
                    yield Finding("over_budget", job.job_id, job.name or job.job_id, why, True,
                                  tags={T.JOB: job.job_id, T.OWNER: job.owner, T.PROJECT: job.project})

    def _running(self) -> list:
        """The accepted and running jobs, through the ledger's index of open jobs: an hourly pass that read
        the whole jobs table would grow with every job ever run. Read once per scan."""
        if self._open is None:
            self._open = self.ledger.open_jobs(JobState.ACCEPTED, JobState.RUNNING)
        return self._open

    # -- act ------------------------------------------------------------------------------
    def apply(self, findings: list[Finding]) -> list[Finding]:
        """Act on each finding as its action says; untagged ones only with include_untagged."""
        for f in findings:
            if f.action == "report":
                f.result = "reported"
            elif not f.tagged and not self.policy.include_untagged:
                f.result = "skipped: not tagged by upwell"
            else:
                try:
                    f.result = self._act(f)
                except Exception as exc:
                    log.debug("janitor.action_failed", exc_info=True)
                    f.result = f"failed: {str(exc).splitlines()[0][:300]}"
            log.info("janitor.action", kind=f.kind, resource=f.resource, action=f.action, result=f.result)
        return findings

    def _act(self, f: Finding) -> str:
        """Do what the policy's action says for this finding's kind."""
        batch_kind = f.kind in ("idle_batch_pool", "orphan_batch_job") or not f.resource.startswith("/subscriptions/")
        if f.action == "kill" or f.kind in ("overdue_job", "over_budget"):
            return self._kill(f)
        if f.action == "terminate" and f.kind == "orphan_batch_job":
            self._terminate(f.resource, "upwell job finished")  # Batch finishes it on its own
            return "terminated"
        if f.action == "scale_to_zero" and f.kind == "idle_batch_pool":
            from azure.batch import models as m

            self.client("batch").begin_resize_pool(f.resource, m.BatchPoolResizeOptions(
                target_dedicated_nodes=0, target_low_priority_nodes=0, node_deallocation_option="taskcompletion"),
                polling_interval=0)
            return "resized to 0"
        if f.action == "scale_to_zero" and f.kind == "idle_scale_set":
            from azure.mgmt.compute import models as m

            self.client("compute").virtual_machine_scale_sets.begin_update(
                self.rg, f.name, m.VirtualMachineScaleSetUpdate(sku=m.Sku(capacity=0))).result()
            return "scaled to 0"
        if f.action == "deallocate" and f.kind == "stopped_vm":
            self.client("compute").virtual_machines.begin_deallocate(self.rg, f.name).result()
            return "deallocated"
        if f.action == "delete":
            return self._delete_batch(f) if batch_kind else self._delete(f)
        raise ConfigError(f"action {f.action!r} does not apply to {f.kind}")

    def _delete(self, f: Finding) -> str:
        if f.kind == "unattached_disk":
            self.client("compute").disks.begin_delete(self.rg, f.name).result()
        elif f.kind == "unattached_nic":
            self.client("network").network_interfaces.begin_delete(self.rg, f.name).result()
        elif f.kind == "unattached_ip":
            self.client("network").public_ip_addresses.begin_delete(self.rg, f.name).result()
        else:
            self.client("resources").resources.begin_delete_by_id(f.resource, api_version=self._api_version(
                f.resource)).result()
        return "deleted"

    def _terminate(self, batch_job: str, reason: str):
        # The options model is not exported by azure-batch 15.x; the REST body is this one field.
        return self.client("batch").begin_terminate_job(
            batch_job, {"terminateReason": f"upwell janitor: {reason}"[:64]}, polling_interval=0)

    def _delete_batch(self, f: Finding) -> str:
        if f.kind == "orphan_batch_job":
            self.client("batch").begin_delete_job(f.resource, polling_interval=0)
        else:  # an idle or expired Batch pool
            self.client("batch").begin_delete_pool(f.resource, polling_interval=0)
        return "deleted"

    def _api_version(self, resource_id: str) -> str:
        parts = resource_id.split("/providers/", 1)[1].split("/")
        rtype = f"{parts[0]}/{parts[1]}".lower()
        if rtype in DELETE_API:
            return DELETE_API[rtype]
        # The janitor's role (bicep/modules/rbac.bicep, "upwell janitor") may delete only these
        # types; asking the provider for another type's API version would only lead to a 403.
        raise ConfigError(f"{rtype} is reported, not deleted: the janitor's role deletes only {sorted(DELETE_API)}")

    def _kill(self, f: Finding) -> str:
        """Mark the job killed (agents drop its remaining shards, so it finishes and is reported as
        failed) and end its Batch job, if it has one."""
        self.ledger.update_job(f.resource, killed_at=now_iso(), killed_reason=f.reason, message=f.reason)
        if self.batch_url:
            from upwell.pools.build_batch import batch_job_id

            try:
                self._terminate(batch_job_id(f.resource), f.reason.removeprefix("killed: ")).result()
            except Exception as exc:
                if "JobNotFound" not in str(exc) and "404" not in str(exc):
                    raise
        return "killed"


def pool_activity(storage: Any) -> Callable[[str, float], bool]:
    """Was a pool busy (backlog, in-flight shards or busy nodes) within the last N minutes? From the
    scaler's decisions in the scaling log; a pool with no decision in the window counts as idle."""
    from datetime import timedelta

    from upwell.scalelog import ScalingLog

    decisions = ScalingLog(storage).decisions

    def active(pool: str, minutes: float) -> bool:
        since = (datetime.now(UTC) - timedelta(minutes=minutes)).isoformat(timespec="milliseconds")
        return any(d.backlog + d.busy > 0 for d in decisions(pool, since.replace("+00:00", "Z")))

    return active


def from_env(storage: Any, policy: Policy | None = None, env: Mapping[str, str] | None = None, **kw: Any) -> Janitor:
    """A janitor for the deployment the environment describes (UPWELL_SUBSCRIPTION_ID,
    UPWELL_RESOURCE_GROUP, UPWELL_BATCH_ACCOUNT_URL); without them it checks the ledger only."""
    import os

    from upwell.ledger import Ledger
    from upwell.settings import cost_settings

    env = os.environ if env is None else env
    money = cost_settings(env)  # UPWELL_BUDGETS and its window
    kw.setdefault("budgets", money.get("budgets"))
    kw.setdefault("budget_window_days", money.get("budget_window_days", 30.0))
    return Janitor(policy, subscription_id=env.get("UPWELL_SUBSCRIPTION_ID", ""),
                   resource_group=env.get("UPWELL_RESOURCE_GROUP", ""),
                   batch_url=env.get("UPWELL_BATCH_ACCOUNT_URL", ""), ledger=Ledger(storage),
                   pool_active=pool_activity(storage), **kw)


def run(storage: Any, *, apply: bool = False, policy: Policy | None = None, **kw: Any) -> list[Finding]:
    """One janitor pass: scan, act when ``apply``, record everything."""
    janitor = from_env(storage, policy, **kw)
    findings = janitor.scan()
    if apply:
        janitor.apply(findings)
    FindingsLog(storage).record(findings, applied=apply)
    return findings
