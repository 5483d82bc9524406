"""Contract tests for the janitor: the real azure-mgmt-compute, azure-mgmt-network,
azure-mgmt-resource and azure-batch clients against the recording server on 127.0.0.1, which
answers with ARM and Batch responses shaped as the services send them. The ledger is real
(Azurite). Each kind of leak is found; with apply each is acted on; untagged ones are left alone."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from upwell import names
from upwell.cost import tags as T
from upwell.ledger import JobRow, Ledger
from upwell.ops import janitor as J
from upwell.ops.findings import FindingsLog
from upwell.storage import Storage

RG = "/subscriptions/s1/resourceGroups/rg"
CP, NP = rf"{RG}/providers/Microsoft\.Compute", rf"{RG}/providers/Microsoft\.Network"
TAGS = {T.PROJECT: "ocean", T.OWNER: "lead", T.EXPIRES: "2099-01-01"}
OLD = {**TAGS, T.EXPIRES: "2020-01-01"}


def arm(kind: str, name: str, tags: dict | None, **props) -> dict:
    provider = {"disks": "Microsoft.Compute", "virtualMachines": "Microsoft.Compute",
                "virtualMachineScaleSets": "Microsoft.Compute", "snapshots": "Microsoft.Compute",
                "networkInterfaces": "Microsoft.Network", "publicIPAddresses": "Microsoft.Network"}[kind]
    out = {"id": f"{RG}/providers/{provider}/{kind}/{name}", "name": name, "type": f"{provider}/{kind}",
           "location": "eastus", "properties": props}
    if tags is not None:
        out["tags"] = tags
    return out


def meta(tags: dict) -> list[dict]:
    return [{"name": k, "value": v} for k, v in tags.items()]


@pytest.fixture
def cloud(server):
    """The recorded responses of one resource group with every kind of leak, tagged and untagged."""
    disks = [arm("disks", "leak-disk", TAGS, diskState="Unattached", diskSizeGB=128),
             arm("disks", "their-disk", None, diskState="Unattached", diskSizeGB=64),
             arm("disks", "os-disk", TAGS, diskState="Attached", diskSizeGB=30) | {"managedBy": f"{RG}/vm/x"}]
    nics = [arm("networkInterfaces", "leak-nic", TAGS),
            arm("networkInterfaces", "used-nic", TAGS, virtualMachine={"id": f"{RG}/vm/x"})]
    ips = [arm("publicIPAddresses", "leak-ip", TAGS, ipAddress="20.1.2.3"),
           arm("publicIPAddresses", "used-ip", TAGS, ipConfiguration={"id": f"{RG}/nic/ipc"})]
    vms = [arm("virtualMachines", "stopped-vm", TAGS), arm("virtualMachines", "their-stopped-vm", None),
           arm("virtualMachines", "deallocated-vm", TAGS)]
    power = {"stopped-vm": "stopped", "their-stopped-vm": "stopped", "deallocated-vm": "deallocated"}
    sets = [arm("virtualMachineScaleSets", f"upwell-{p}", {**TAGS, T.POOL: p}) | {"sku": {"name": "D4", "capacity": n}}
            for p, n in (("cpu", 3), ("gpu", 1))]
    generic = [*disks, *nics, arm("snapshots", "old-snap", OLD), arm("snapshots", "new-snap", TAGS),
               arm("disks", "leak-disk", OLD)]  # already found as unattached: listed once
    server.route("GET", rf"{CP}/disks", (200, {"value": disks}))
    server.route("GET", rf"{NP}/networkInterfaces", (200, {"value": nics}))
    server.route("GET", rf"{NP}/publicIPAddresses", (200, {"value": ips}))
    server.route("GET", rf"{CP}/virtualMachines", (200, {"value": vms}))
    server.route("GET", rf"{CP}/virtualMachines/([\w-]+)/instanceView",
                 lambda rec, m: (200, {"statuses": [{"code": "ProvisioningState/succeeded"},
                                                    {"code": f"PowerState/{power[m[1]]}"}]}))
    server.route("GET", rf"{CP}/virtualMachineScaleSets", (200, {"value": sets}))
    server.route("GET", rf"{RG}/resources", (200, {"value": generic}))
    for method, pattern in (("DELETE", rf"{CP}/(disks|snapshots)/[\w-]+"), ("DELETE", rf"{NP}/\w+/[\w-]+"),
                            ("POST", rf"{CP}/virtualMachines/[\w-]+/deallocate")):
        server.route(method, pattern, (200, None))
    server.route("PATCH", rf"{CP}/virtualMachineScaleSets/([\w-]+)",
                 lambda rec, m: (200, next(s for s in sets if s["name"] == m[1]) | {"sku": {"capacity": 0}}))
    pools = [{"id": "upwell-mpi", "allocationState": "steady", "targetDedicatedNodes": 2, "targetLowPriorityNodes": 0,
              "metadata": meta({**TAGS, T.POOL: "mpi"})},
             {"id": "their-pool", "allocationState": "steady", "targetDedicatedNodes": 5, "metadata": []}]
    server.route("GET", r"/pools", (200, {"value": pools}))
    server.route("POST", r"/pools/[\w-]+/resize", (202, None))
    server.route("GET", r"/pools/([\w-]+)", lambda rec, m: (200, next(p for p in pools if p["id"] == m[1])))
    return server


@pytest.fixture
def ledger(azurite):
    store = Storage(azurite.connection_string)
    store.ensure()
    return Ledger(store), store


def _jobs(server, ledger: Ledger, tag: str) -> dict[str, str]:
    """Three upwell jobs: finished (its Batch job still active), running, and running past its wall-clock."""
    done, running, overdue = f"done-{tag}", f"running-{tag}", f"overdue-{tag}"
    two_hours_ago = (datetime.now(UTC) - timedelta(hours=2)).isoformat().replace("+00:00", "Z")
    ledger.create_job(JobRow.from_entity({"job_id": done, "status": "succeeded", "created_at": two_hours_ago}))
    ledger.create_job(JobRow.from_entity({"job_id": running, "status": "running", "started_at": two_hours_ago}))
    ledger.create_job(JobRow.from_entity({"job_id": overdue, "status": "running", "started_at": two_hours_ago,
                                          "max_wall_clock_s": 600, "owner": "lead", "project": "ocean"}))
    batch_jobs = [{"id": f"upwell-{j}", "state": "active", "metadata": meta({**TAGS, T.JOB: j})}
                  for j in (done, running, overdue)] + [{"id": "their-job", "state": "active", "metadata": []}]
    server.route("GET", r"/jobs", (200, {"value": batch_jobs}))
    server.route("POST", r"/jobs/[\w-]+/terminate", (202, None))
    server.route("GET", r"/jobs/([\w-]+)", lambda rec, m: (200, {"id": m[1], "state": "completed"}))
    return {"done": done, "running": running, "overdue": overdue}


def make(server, credential, client_kwargs, ledger, policy=None) -> J.Janitor:
    return J.Janitor(policy, subscription_id="s1", resource_group="rg", batch_url=server.url, credential=credential,
                     client_kwargs=client_kwargs, ledger=ledger, pool_active=lambda pool, minutes: pool == "gpu")


def changes(server) -> list[tuple[str, str]]:
    return [(r.method, r.path) for r in server.requests if r.method in ("DELETE", "POST", "PATCH", "PUT")]


def test_contract_janitor_dry_run_finds_each_leak_and_changes_nothing(cloud, credential, client_kwargs, ledger):
    jobs = _jobs(cloud, ledger[0], "dry")
    found = make(cloud, credential, client_kwargs, ledger[0]).scan()
    got = {(f.kind, f.name, f.tagged) for f in found}
    assert {("unattached_disk", "leak-disk", True), ("unattached_disk", "their-disk", False),
            ("unattached_nic", "leak-nic", True), ("unattached_ip", "leak-ip", True),
            ("stopped_vm", "stopped-vm", True), ("stopped_vm", "their-stopped-vm", False),
            ("idle_scale_set", "upwell-cpu", True), ("idle_batch_pool", "upwell-mpi", True),
            ("expired", "old-snap", True), ("orphan_batch_job", f"upwell-{jobs['done']}", True),
            ("overdue_job", jobs["overdue"], True)} <= got
    names_found = {f.name for f in found}
    # Not leaks: attached, in use, deallocated, busy, not expired, still running, someone else's pool or job.
    assert not names_found & {"os-disk", "used-nic", "used-ip", "deallocated-vm", "upwell-gpu", "new-snap",
                              "their-pool", "their-job", f"upwell-{jobs['running']}"}
    assert sum(1 for f in found if f.name == "leak-disk") == 1
    assert {f.action for f in found if f.kind == "unattached_disk"} == {"delete"}
    assert changes(cloud) == []  # a dry run only reads
    arm_calls = [r for r in cloud.requests if "/subscriptions/" in r.path]
    assert arm_calls and all(r.headers.get("Authorization") == "Bearer fake-token" for r in arm_calls)
    assert not ledger[0].job(jobs["overdue"]).killed_at


def test_contract_janitor_apply_acts_on_tagged_and_leaves_untagged_alone(cloud, credential, client_kwargs, ledger):
    jobs = _jobs(cloud, ledger[0], "apply")
    janitor = make(cloud, credential, client_kwargs, ledger[0])
    findings = janitor.apply(janitor.scan())
    by_name = {f.name: f for f in findings}
    done = changes(cloud)
    assert ("DELETE", f"{RG}/providers/Microsoft.Compute/disks/leak-disk") in done
    assert ("DELETE", f"{RG}/providers/Microsoft.Network/networkInterfaces/leak-nic") in done
    assert ("DELETE", f"{RG}/providers/Microsoft.Network/publicIPAddresses/leak-ip") in done
    assert ("POST", f"{RG}/providers/Microsoft.Compute/virtualMachines/stopped-vm/deallocate") in done
    assert ("DELETE", f"{RG}/providers/Microsoft.Compute/snapshots/old-snap") in done
    assert ("POST", "/pools/upwell-mpi/resize") in done
    assert ("POST", f"/jobs/upwell-{jobs['done']}/terminate") in done
    assert ("POST", f"/jobs/upwell-{jobs['overdue']}/terminate") in done  # the kill switch ends its Batch job
    term = cloud.calls("POST", rf"/jobs/upwell-{jobs['done']}/terminate")[0]
    assert term.body == {"terminateReason": "upwell janitor: upwell job finished"}
    patch = cloud.calls("PATCH", rf"{CP}/virtualMachineScaleSets/upwell-cpu")[0]
    assert patch.body["sku"]["capacity"] == 0
    snap = cloud.calls("DELETE", rf"{CP}/snapshots/old-snap")[0]
    assert snap.q("api-version") == J.DELETE_API["microsoft.compute/snapshots"]
    # Untagged resources are found but never touched.
    untouched = ("their-disk", "their-stopped-vm", "their-pool", "their-job")
    assert not [c for c in done if any(u in c[1] for u in untouched)]
    assert by_name["their-disk"].result == "skipped: not tagged by upwell"
    assert by_name["leak-disk"].result == "deleted" and by_name["upwell-cpu"].result == "scaled to 0"
    killed = ledger[0].job(jobs["overdue"])
    assert killed.killed_at and "max wall-clock of 600 s" in killed.killed_reason
    assert not ledger[0].job(jobs["running"]).killed_at

    # Every finding and what became of it is recorded.
    store = ledger[1]
    FindingsLog(store).record(findings, applied=True)
    rows = [r for r in FindingsLog(store).recent(limit=500) if r.finding.name in by_name]
    assert {r.finding.name: r.finding.result for r in rows}["leak-disk"] == "deleted"
    leak = next(r for r in rows if r.finding.name == "leak-disk")
    assert leak.applied and leak.finding.tags[T.OWNER] == "lead" and leak.finding.tagged


def test_contract_janitor_deletes_only_the_types_its_role_allows(cloud, credential, client_kwargs, ledger):
    """An expired resource of a type outside DELETE_API (the "upwell janitor" role's deletes,
    bicep/modules/rbac.bicep) is reported as not deleted, with no request to ARM: asking the
    provider for an API version and deleting would only meet a 403."""
    from upwell.ops.findings import Finding

    account = f"{RG}/providers/Microsoft.Storage/storageAccounts/oldlogs"
    finding = Finding("expired", account, "oldlogs", "past upwell-expires", True, tags=OLD)
    finding.action = "delete"
    before = len(cloud.requests)
    [done] = make(cloud, credential, client_kwargs, ledger[0]).apply([finding])
    assert done.result.startswith("failed: microsoft.storage/storageaccounts is reported, not deleted")
    assert cloud.requests[before:] == []


def test_contract_janitor_policy_file(cloud, credential, client_kwargs, ledger, tmp_path):
    _jobs(cloud, ledger[0], "policy")
    path = tmp_path / "janitor.yaml"
    path.write_text("idle_minutes: 30\ninclude_untagged: true\nactions:\n  unattached_disk: report\n"
                    "  stopped_vm: delete\n")
    policy = J.Policy.load(path)
    janitor = make(cloud, credential, client_kwargs, ledger[0], policy)
    findings = janitor.apply(janitor.scan())
    done = changes(cloud)
    assert not [c for c in done if "/disks/" in c[1]]  # report only
    assert {f.result for f in findings if f.kind == "unattached_disk"} == {"reported"}
    # include_untagged: the untagged stopped VM is acted on too (the policy says delete, generic by id).
    assert ("DELETE", f"{RG}/providers/Microsoft.Compute/virtualMachines/their-stopped-vm") in done
    assert next(f for f in findings if f.kind == "idle_scale_set").reason.endswith("for 30 min")
    bad = tmp_path / "bad.yaml"
    bad.write_text("actions:\n  unattached_disk: burn\n")
    with pytest.raises(Exception, match="burn"):
        J.Policy.load(bad)


def test_janitor_without_azure_settings_checks_the_ledger_only(ledger):
    led, store = ledger
    stale = (datetime.now(UTC) - timedelta(hours=3)).isoformat().replace("+00:00", "Z")
    led.create_job(JobRow.from_entity({"job_id": "local-overdue", "status": "accepted", "accepted_at": stale,
                                       "max_wall_clock_s": 60}))
    findings = J.run(store, apply=True, env={})
    mine = [f for f in findings if f.resource == "local-overdue"]
    assert [(f.kind, f.result) for f in mine] == [("overdue_job", "killed")]
    assert led.job("local-overdue").killed_at
    assert names.JANITOR_TABLE in names.TABLES


def test_janitor_kills_the_running_jobs_of_an_owner_or_project_past_its_budget(ledger):
    led, store = ledger
    now = datetime.now(UTC).isoformat().replace("+00:00", "Z")

    def job(job_id: str, status: str, owner: str, project: str, spent: float) -> None:
        led.create_job(JobRow.from_entity({"job_id": job_id, "status": status, "created_at": now, "accepted_at": now,
                                           "owner": owner, "project": project, "spent_usd": spent}))

    job("b-lead-done", "succeeded", "b-lead", "b-ocean", 0.30)  # spent, finished: counts, is not killed
    job("b-lead-run", "running", "b-lead", "b-ice", 0.05)
    job("b-other-run", "running", "b-other", "b-ocean", 0.01)  # its project, b-ocean, is past its budget too
    job("b-fine-run", "running", "b-fine", "b-land", 0.01)
    budgets = json.dumps({"owner": {"b-lead": 0.25, "b-fine": 5}, "project": {"b-ocean": 0.2}})
    findings = J.run(store, apply=True, env={"UPWELL_BUDGETS": budgets})
    mine = {f.resource: f for f in findings if f.kind == "over_budget"}
    assert set(mine) == {"b-lead-run", "b-other-run"}, mine
    assert "owner 'b-lead' has spent $0.3500 of a $0.2500 budget" in mine["b-lead-run"].reason
    assert "project 'b-ocean' has spent $0.3100 of a $0.2000 budget" in mine["b-other-run"].reason
    assert {f.result for f in mine.values()} == {"killed"}
    assert led.job("b-lead-run").killed_reason == mine["b-lead-run"].reason
    assert not led.job("b-fine-run").killed_at and not led.job("b-lead-done").killed_at
    # A dry run (and a deployment without budgets) finds and changes nothing more.
    assert not [f for f in J.run(store, env={}) if f.kind == "over_budget"]
