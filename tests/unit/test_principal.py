"""Who is asking: App Service's X-MS-CLIENT-PRINCIPAL read into a caller and its projects (issue 27 item 3)."""

from __future__ import annotations

import base64
import json

import pytest

from upwell.access import principal
from upwell.errors import ConfigError, PrincipalInvalid, ProjectForbidden
from upwell.local.devhost.web import with_principal
from upwell.settings import Settings, parse_project_roles

pytestmark = pytest.mark.access

ROLE_URI = "http://schemas.microsoft.com/ws/2008/06/identity/claims/role"
ROLES = {"ocean.members": ("ocean",), "grp-1": ("reef", "kelp"), "upwell.operator": ("*",)}


def encode(document: dict) -> str:
    """The header value App Service sends: base64 of the JSON document."""
    return base64.b64encode(json.dumps(document).encode()).decode()


def doc(*claims: tuple[str, str], role_typ: str = ROLE_URI, name_typ: str = "name") -> dict:
    """A principal document in App Service's documented shape."""
    return {"auth_typ": "aad", "claims": [{"typ": t, "val": v} for t, v in claims], "name_typ": name_typ,
            "role_typ": role_typ}


@pytest.mark.parametrize(("claims", "projects"), [
    ((("name", "ana"), (ROLE_URI, "ocean.members")), {"ocean"}),
    ((("name", "rui"), ("groups", "grp-1")), {"reef", "kelp"}),
    ((("name", "eva"), ("roles", "ocean.members"), ("groups", "grp-1")), {"ocean", "reef", "kelp"}),
    ((("name", "bob"), (ROLE_URI, "unknown.role"), ("groups", "grp-x")), set()),
])
def test_roles_and_groups_map_to_projects(claims, projects):
    header = encode(doc(*claims))
    who = principal.caller({"X-MS-CLIENT-PRINCIPAL": header}, {}, ROLES)
    assert who.kind == "user" and who.name == claims[0][1] and who.projects == projects
    assert not who.everything and all(who.allows(p) for p in projects) and not who.allows("other")


def test_a_caller_refused_names_the_project_and_theirs():
    who = principal.of_user(doc(("name", "ana"), (ROLE_URI, "ocean.members")), ROLES)
    with pytest.raises(ProjectForbidden, match=r"ana may not cancel jobs in project 'reef' \(their projects: ocean\)"):
        who.require("reef", "cancel jobs")
    who.require("ocean", "cancel jobs")


def test_the_star_opens_every_project_and_no_principal_is_a_function_key():
    operator = principal.of_user(doc(("name", "op"), (ROLE_URI, "upwell.operator")), ROLES)
    assert operator.everything and operator.allows("anything")
    keyed = principal.caller({"x-functions-key": "k"}, {}, ROLES)
    assert keyed.kind == "function_key" and keyed.projects is None and keyed.name == "function key"
    assert principal.caller({}, {"code": "k"}, ROLES).name == "function key"
    assert principal.caller({}, {}, ROLES).name == "no key (local host)"


@pytest.mark.parametrize(("value", "message"), [
    ("not base64!", "not base64-encoded JSON"),
    (base64.b64encode(b"[1, 2]").decode(), "a 'claims' list"),
    (base64.b64encode(json.dumps({"claims": [{"typ": "name"}]}).encode()).decode(), r"claims\[0\]"),
    ("A" * (principal.MAX_HEADER + 1), "at most"),
])
def test_a_malformed_principal_is_refused_with_the_reason(value, message):
    with pytest.raises(PrincipalInvalid, match=message):
        principal.caller({"X-MS-CLIENT-PRINCIPAL": value}, {}, ROLES)


def test_the_devhost_passes_the_derived_headers_as_app_service_does():
    oid = "http://schemas.microsoft.com/identity/claims/objectidentifier"
    header = encode(doc(("preferred_username", "ana@lab.org"), (oid, "0000-1")))
    out = with_principal({"X-MS-CLIENT-PRINCIPAL": header, "X-MS-CLIENT-PRINCIPAL-NAME": "forged"})
    assert out["X-MS-CLIENT-PRINCIPAL-NAME"] == "ana@lab.org" and out["X-MS-CLIENT-PRINCIPAL-ID"] == "0000-1"
    assert out["X-MS-CLIENT-PRINCIPAL-IDP"] == "aad"
    assert with_principal({"x-ms-client-principal-name": "forged", "Accept": "*/*"}) == {"Accept": "*/*"}
    with pytest.raises(PrincipalInvalid):
        with_principal({"x-ms-client-principal": "%%%"})


def test_project_roles_setting():
    assert Settings.from_env({"UPWELL_PROJECT_ROLES": '{"a": "ocean", "b": ["reef", "kelp"]}'}).project_roles == \
        {"a": ("ocean",), "b": ("reef", "kelp")}
    assert Settings.from_env({}).project_roles == {}
    for bad in ("[1]", "{", '{"a": [1]}', '{"a": ""}'):
        with pytest.raises(ConfigError, match="UPWELL_PROJECT_ROLES"):
            parse_project_roles(bad)


def test_the_http_functions_refuse_a_bad_principal_and_a_cross_site_action_before_any_storage():
    import azure.functions as func

    from handlers import api

    def request(method: str, **headers: str) -> func.HttpRequest:
        return func.HttpRequest(method, "http://127.0.0.1:7071/api/jobs/j1/cancel", headers=headers,
                                route_params={"job_id": "j1"}, body=b"")

    refused = api.cancel(request("POST", **{"Sec-Fetch-Site": "cross-site"}))
    assert refused.status_code == 403 and b"cross-site" in refused.get_body()
    bad = api.job(request("GET", **{"X-MS-CLIENT-PRINCIPAL": "%%%"}))
    assert bad.status_code == 401 and b"not base64-encoded JSON" in bad.get_body()
