"""The role table in docs/deploy.md matches the code's Azure calls and the Bicep's grants (issue 23, h).

- every SDK call the deployed code makes (roles_scan: an AST scan for methods of the
  installed Azure SDK clients) has a row, and every row names a call the code makes;
- every identity of a row holds one of its roles in bicep/: a built-in role by its id in a
  roleDefinitionId, a custom role by its roleName in a roleDefinitions resource
  that a roleAssignment to that identity (functionPrincipalId, workerPrincipalId,
  deployerPrincipalId) references;
- a planted, undocumented call fails the first check.

Action names follow Azure's resource provider operations and the Storage and Batch
REST references' authorization sections; the built-in role ids are those of the
Azure built-in roles reference (the same in every tenant).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import roles_scan

pytestmark = pytest.mark.cloudfaults  # issue 23, acceptance h

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "deploy.md"
DEPLOYED = ("upwell/**/*.py", "workers/**/*.py", "handlers/**/*.py", "function_app.py")
LOCAL_ONLY = "upwell/local/"  # Azurite and the devhost; never runs on Azure
BUILT_IN = {
    "Reader": "acdd72a7-3385-48ef-bd42-f606fba81ae7",
    "Storage Blob Data Owner": "b7e6dc6d-f1e8-4753-8033-0f276bb0955b",
    "Storage Blob Data Contributor": "ba92f5b4-2d11-453d-a403-e96b0029c9fe",
    "Storage Queue Data Contributor": "974c5e8b-45b9-4653-ba55-5f855dd0fb88",
    "Storage Table Data Contributor": "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3",
    "Azure Batch Data Contributor": "6aaa78f1-f7de-44ca-8722-c64a23943cae",
    "Managed Identity Operator": "f1a07417-d97a-45cb-824c-7a7467783830",
    "Virtual Machine Contributor": "9980e02c-c2be-4d73-94e8-173b1dc7cf3c",
    "EventGrid Data Sender": "d5a91429-5739-47e2-a06b-3470a27159e7",
    "Key Vault Secrets User": "4633458b-17de-408a-b874-0445c86b69e6",
}
IDENTITIES = {"function", "worker", "deployer"}


def table(text: str) -> list[list[str]]:
    """The rows between the roles markers, as stripped cells (header and rule dropped)."""
    block = text.split("<!-- roles:begin -->", 1)[1].split("<!-- roles:end -->", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in block.splitlines()
            if line.startswith("|")]
    return rows[2:]


def documented(rows: list[list[str]]) -> set[tuple[str, str]]:
    return {(r[0].strip("`"), r[1].strip("`")) for r in rows}


def role_names(cell: str) -> set[str]:
    """'A (function), B (worker)' or 'A + B' -> {'A', 'B'}."""
    cell = re.sub(r"\([^)]*\)", "", cell)
    return {part.strip() for part in re.split(r"[,+]", cell) if part.strip()}


def code_calls() -> set[tuple[str, str]]:
    return {c for c in roles_scan.scan(ROOT, DEPLOYED) if not c[0].startswith(LOCAL_ONLY)}


PRINCIPALS = {"functionPrincipalId": "function", "workerPrincipalId": "worker", "deployerPrincipalId": "deployer"}


def granted(bicep: str) -> set[tuple[str, str]]:
    """(role name, identity) for every roleAssignment in the templates that grants a role the
    table can name to one of our identities."""
    by_guid = {g: n for n, g in BUILT_IN.items()}
    guid_vars = {v: by_guid[g] for v, g in re.findall(r"var (\w+) = '([0-9a-f-]{36})'", bicep) if g in by_guid}
    lists = dict(re.findall(r"var (\w+) = \[(.*?)\]", bicep, re.S))
    custom = dict(re.findall(r"resource (\w+) 'Microsoft\.Authorization/roleDefinitions@[^']+' = .*?"
                             r"roleName: '([^'(]+?)\s*\(", bicep, re.S))
    out = set()
    for head, body in re.findall(r"(resource \w+ 'Microsoft\.Authorization/roleAssignments@[^\n]*)\n(.*?)\n\}",
                                 bicep, re.S):
        who = re.search(r"principalId: (\w+)", body)
        ref = re.search(r"roleDefinitionId: (?:subscriptionResourceId\([^,]+, )?(\w+)(\.(?:id|name))?\)?\s*$",
                        body, re.M)
        if not who or who.group(1) not in PRINCIPALS or not ref:
            continue
        loop = re.search(r"\[for (\w+) in (\w+):", head)
        if ref.group(2):  # a custom role: its definition's .id or .name
            roles = {custom.get(ref.group(1), "")}
        elif loop and ref.group(1) == loop.group(1):
            roles = {guid_vars.get(v, "") for v in lists.get(loop.group(2), "").split()}
        else:
            roles = {guid_vars.get(ref.group(1), "")}
        out |= {(r, PRINCIPALS[who.group(1)]) for r in roles if r}
    return out


@pytest.fixture(scope="module")
def rows() -> list[list[str]]:
    return table(DOC.read_text(encoding="utf-8"))


def test_every_call_in_the_code_is_in_the_table(rows):
    missing = code_calls() - documented(rows)
    assert not missing, f"calls missing from docs/deploy.md's role table: {sorted(missing)}"


def test_every_row_is_a_call_the_code_makes(rows):
    stale = documented(rows) - code_calls()
    assert not stale, f"rows in docs/deploy.md's role table that the code no longer makes: {sorted(stale)}"


def test_every_role_in_the_table_is_granted_in_bicep(rows):
    """Each identity of a row holds at least one of the row's roles (a row such as 'Storage Blob Data
    Owner (function), Storage Blob Data Contributor (worker)' pairs them), and every role named is
    granted to some identity of its row."""
    bicep = "\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "bicep").rglob("*.bicep")))
    grants = granted(bicep)
    assert grants, "no role assignment found in bicep/"
    for r in rows:
        roles, who = role_names(r[3]), {w.strip() for w in r[4].split(",")}
        for identity in who:
            assert any((role, identity) in grants for role in roles), f"{identity} holds none of {roles}: {r}"
        for role in roles:
            assert any((role, identity) in grants for identity in who), f"{role} is granted to none of {who}: {r}"


def test_every_row_names_a_permission_and_a_known_identity(rows):
    for r in rows:
        assert len(r) == 5 and r[2], f"row without a permission: {r}"
        assert {w.strip() for w in r[4].split(",")} <= IDENTITIES, f"unknown identity in {r}"


def test_the_quota_read_and_the_janitor_scan_are_granted(rows):
    """Issue 23, item 9: the two 403s the deployment had."""
    by_call = {(r[0].strip("`"), r[1].strip("`")): r for r in rows}
    quota = by_call[("upwell/pools/vmss.py", "usage.list")]
    assert "Microsoft.Compute/locations/usages/read" in quota[2] and "function" in quota[4]
    scan = by_call[("upwell/ops/janitor.py", "disks.list_by_resource_group")]
    assert role_names(scan[3]) == {"Reader"}


def test_a_planted_undocumented_call_fails(rows, tmp_path):
    """The scan sees a call nobody documented (a new ARM read in the janitor)."""
    planted = tmp_path / "upwell" / "ops" / "janitor.py"
    planted.parent.mkdir(parents=True)
    planted.write_text((ROOT / "upwell/ops/janitor.py").read_text(encoding="utf-8")
                       + "\n\ndef _leak(j):\n    return j.client('compute').snapshots.list_by_resource_group(j.rg)\n")
    found = roles_scan.scan(tmp_path, ("upwell/**/*.py",)) - documented(rows)
    assert found == {("upwell/ops/janitor.py", "snapshots.list_by_resource_group")}


def test_a_planted_data_plane_call_fails(rows, tmp_path):
    planted = tmp_path / "workers" / "sneaky.py"
    planted.parent.mkdir(parents=True)
    planted.write_text("def drain(queue_client):\n    queue_client.clear_messages()\n")
    assert roles_scan.scan(tmp_path, ("workers/*.py",)) - documented(rows) == {("workers/sneaky.py", "clear_messages")}


def test_our_own_methods_are_not_sdk_calls():
    """A ledger's update_job or a path's exists() shares a name with an SDK method, not a client."""
    assert roles_scan.calls_in("self.ledger.update_job(x)\nlog_path.exists()\n") == set()
