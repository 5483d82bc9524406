"""Contract tests for ``upwell access``: the real azure-mgmt-authorization client against the recording
server (Role Assignments Create, List For Scope, Delete at api-version 2022-04-01), with every condition
sent parsed against the documented grammar and evaluated for what it allows."""

from __future__ import annotations

import pytest

from upwell.access import conditions as C
from upwell.access import grammar
from upwell.access.assignments import ArmAssignments
from upwell.access.caller import may_write
from upwell.access.roles import CONTRIBUTOR, DATA_ACTIONS, READER, Grant, Role
from upwell.errors import AccessError

pytestmark = pytest.mark.access

SCOPE = "/subscriptions/s1/resourceGroups/rg/providers/Microsoft.Storage/storageAccounts/upwellstore"
RA = r"/subscriptions/s1/resourceGroups/rg/providers/Microsoft\.Storage/storageAccounts/upwellstore" \
     r"/providers/Microsoft\.Authorization/roleAssignments"
READ, WRITE = f"{C.BLOBS}/read", f"{C.BLOBS}/write"


def allows(props: dict, action: str, container: str, path: str = "", sub: str = "", **attrs) -> bool:
    """What Azure decides: the role's data actions, then the condition."""
    if action not in DATA_ACTIONS[props["roleDefinitionId"].rsplit("/", 1)[-1]]:
        return False
    cond = props["condition"]
    a = {("Resource", C.CONTAINER_NAME): container, ("Resource", C.BLOB_PATH): path}
    if "tag" in attrs:
        a[("Resource", f"{C.BLOBS}/tags:project<$key_case_sensitive$>")] = attrs["tag"]
    if "prefix" in attrs:
        a[("Request", f"{C.BLOBS}:prefix")] = attrs["prefix"]
    return grammar.evaluate(grammar.parse(cond), grammar.Request(action, sub, a))


def echo(rec, m):
    """ARM's answer to a create: the assignment, with its id and name."""
    name = rec.path.rsplit("/", 1)[-1]
    return 201, {"id": rec.path, "name": name, "type": "Microsoft.Authorization/roleAssignments",
                 "properties": {**rec.body["properties"], "scope": SCOPE}}


@pytest.fixture
def store(server, credential, client_kwargs):
    return ArmAssignments(SCOPE, subscription_id="s1", credential=credential, client_kwargs=client_kwargs)


@pytest.mark.parametrize("role", list(Role))
def test_contract_grant_sends_one_conditioned_assignment(server, store, role):
    server.route("PUT", rf"{RA}/[0-9a-f-]{{36}}", echo)
    assert store.grant(Grant("oid-ann", "ocean", role)) is True
    (put,) = server.calls("PUT", rf"{RA}/.*")
    assert put.q("api-version") == "2022-04-01"
    assert put.headers["Authorization"] == "Bearer fake-token"
    props = put.body["properties"]
    assert props["principalId"] == "oid-ann" and props["principalType"] == "User"
    assert props["roleDefinitionId"] == ("/subscriptions/s1/providers/Microsoft.Authorization/roleDefinitions/"
                                         + (READER if role is Role.VIEWER else CONTRIBUTOR))
    assert props["conditionVersion"] == "2.0"
    assert props["description"] == f"upwell-access project=ocean role={role.value}"
    grammar.parse(props["condition"])  # the documented grammar accepts it
    # uploads: own project only, and only for roles that write
    assert allows(props, WRITE, "incoming", "ocean/run1/job.yaml") is (role is not Role.VIEWER)
    assert not allows(props, WRITE, "incoming", "clinic/run1/job.yaml")
    assert not allows(props, WRITE, "incoming", "oceanic/x.csv")
    assert not allows(props, WRITE, "results", "job-1/s00000.json")
    # payloads and pipelines: operators only
    assert allows(props, WRITE, "payloads", "tool/1.0.0.yaml") is (role is Role.OPERATOR)
    assert allows(props, WRITE, "pipelines", "rule.yaml") is (role is Role.OPERATOR)
    # reads: incoming/<P>/, and job blobs tagged project=P
    assert allows(props, READ, "incoming", "ocean/a.csv")
    assert not allows(props, READ, "incoming", "clinic/a.csv")
    assert allows(props, READ, "reports", "job-1/index.html", tag="ocean")
    assert not allows(props, READ, "reports", "job-1/index.html", tag="clinic")
    assert not allows(props, READ, "results", "job-1/s00000.json")  # untagged
    assert not allows(props, READ, "payloads", "tool/1.0.0.yaml", tag="ocean")
    # listing: incoming only under the project's prefix
    assert allows(props, READ, "incoming", sub="Blob.List", prefix="ocean/")
    assert not allows(props, READ, "incoming", sub="Blob.List", prefix="clinic/")
    assert not allows(props, READ, "incoming", sub="Blob.List")


def test_contract_grant_twice_is_one_assignment(server, store):
    """The assignment's name is derived from scope, principal, project and role: ARM's 409
    RoleAssignmentExists on the second grant is success, not an error."""
    server.route("PUT", rf"{RA}/[0-9a-f-]{{36}}", echo,
                 )
    g = Grant("oid-ann", "ocean", Role.SUBMITTER)
    assert store.grant(g) is True
    server.route("PUT", rf"{RA}/[0-9a-f-]{{36}}", (409, {"error": {"code": "RoleAssignmentExists",
                                                                   "message": "The role assignment already exists."}}))
    assert store.grant(g) is False
    names = {r.path.rsplit("/", 1)[-1] for r in server.calls("PUT", rf"{RA}/.*")}
    assert names == {g.name(SCOPE)}


def test_contract_grant_refused_is_a_named_error(server, store):
    server.route("PUT", rf"{RA}/[0-9a-f-]{{36}}", (403, {"error": {
        "code": "AuthorizationFailed", "message": "The client does not have authorization to perform action "
                                                  "'Microsoft.Authorization/roleAssignments/write'"}}))
    with pytest.raises(AccessError) as caught:
        store.grant(Grant("oid-ann", "ocean", Role.VIEWER))
    assert caught.value.code == "AuthorizationFailed" and caught.value.status == 403


def _listed(principal, project, role, name):
    g = Grant(principal, project, role)
    return {"id": f"{SCOPE}/providers/Microsoft.Authorization/roleAssignments/{name}", "name": name,
            "properties": {"roleDefinitionId": f"/subscriptions/s1/providers/Microsoft.Authorization/"
                                               f"roleDefinitions/{g.role_definition}",
                           "principalId": principal, "principalType": "User", "scope": SCOPE,
                           "condition": g.condition, "conditionVersion": "2.0", "description": g.description}}


def test_contract_list_reads_the_scope_and_keeps_upwell_assignments(server, store):
    other = {"id": f"{SCOPE}/providers/Microsoft.Authorization/roleAssignments/x", "name": "x",
             "properties": {"roleDefinitionId": "/subscriptions/s1/providers/Microsoft.Authorization/"
                                                f"roleDefinitions/{CONTRIBUTOR}", "principalId": "oid-fn",
                            "principalType": "ServicePrincipal", "scope": SCOPE}}
    server.route("GET", RA, (200, {"value": [_listed("oid-ann", "ocean", Role.OPERATOR, "a1"), other]}))
    found = store.list()
    (get,) = server.calls("GET", RA)
    assert get.q("$filter") == "atScope()" and get.q("api-version") == "2022-04-01"
    grants = [a.grant for a in found]
    assert grants[0] == Grant("oid-ann", "ocean", Role.OPERATOR) and grants[1] is None
    grammar.parse(found[0].condition)
    # the caller check reads the same records: the operator may write payloads, the function app's
    # unconditioned contributor role too; a submitter's condition keeps payloads out
    assert may_write([found[0]], "payloads/tool/1.0.0.yaml") and may_write([found[1]], "payloads/t/1.yaml")
    server.route("GET", RA, (200, {"value": [_listed("oid-bo", "ocean", Role.SUBMITTER, "b1")]}))
    submitter = store.list(principal="oid-bo")
    assert server.calls("GET", RA)[-1].q("$filter") == "principalId eq 'oid-bo'"
    assert not may_write(submitter, "payloads/tool/1.0.0.yaml")
    assert may_write(submitter, "incoming/ocean/job.yaml") and not may_write(submitter, "incoming/clinic/job.yaml")


def test_contract_revoke_deletes_by_name(server, store):
    server.route("GET", RA, (200, {"value": [_listed("oid-ann", "ocean", Role.SUBMITTER, "a1"),
                                             _listed("oid-ann", "clinic", Role.VIEWER, "a2")]}))
    server.route("DELETE", rf"{RA}/a1", (200, _listed("oid-ann", "ocean", Role.SUBMITTER, "a1")))
    gone = [a for a in store.list(principal="oid-ann") if a.grant.project == "ocean"]
    for a in gone:
        store.revoke(a)
    (delete,) = server.calls("DELETE", rf"{RA}/.*")
    assert delete.path.endswith("/roleAssignments/a1") and delete.q("api-version") == "2022-04-01"
    server.route("DELETE", rf"{RA}/a1", (404, {"error": {"code": "RoleAssignmentNotFound", "message": "gone"}}))
    store.revoke(gone[0])  # a second revoke finds it gone: done, not an error


def test_contract_the_push_check_asks_arm_for_the_signed_in_callers_roles(server, client_kwargs):
    """On Azure the caller is the token's oid; its assignments come from List For Scope with a principal
    filter, and a submitter's are refused with NotOperator where an operator's pass."""
    import base64
    import json
    import time

    from azure.core.credentials import AccessToken

    from upwell.access.caller import require_operator
    from upwell.errors import NotOperator
    from upwell.settings import Settings

    claims = base64.urlsafe_b64encode(json.dumps({"oid": "oid-bo"}).encode()).decode().rstrip("=")

    class SignedIn:
        def get_token(self, *scopes, **kwargs):
            return AccessToken(f"e30.{claims}.sig", int(time.time()) + 3600)

    settings = Settings(access_scope=SCOPE)
    store = ArmAssignments(SCOPE, subscription_id="s1", credential=SignedIn(), client_kwargs=client_kwargs)
    server.route("GET", RA, (200, {"value": [_listed("oid-bo", "ocean", Role.SUBMITTER, "b1")]}))
    with pytest.raises(NotOperator) as caught:
        require_operator(settings, "payloads/tool/1.0.0.yaml", store=store)
    assert "oid-bo" in str(caught.value) and caught.value.code == "NotOperator"
    assert server.calls("GET", RA)[-1].q("$filter") == "principalId eq 'oid-bo'"
    server.route("GET", RA, (200, {"value": [_listed("oid-bo", "ocean", Role.OPERATOR, "b2")]}))
    assert require_operator(settings, "payloads/tool/1.0.0.yaml", store=store) == "oid-bo"
