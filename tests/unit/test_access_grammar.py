"""The condition grammar (upwell.access.grammar) on the documented examples, on what it must refuse, and
on every condition upwell generates (issue 27, item 2)."""

from __future__ import annotations

import pytest

from upwell.access import grammar
from upwell.access.conditions import BadProject, check_project, condition
from upwell.access.grammar import ConditionSyntaxError, Request

pytestmark = pytest.mark.access

B = "Microsoft.Storage/storageAccounts/blobServices/containers"
DOCUMENTED = [  # learn.microsoft.com conditions-format and storage-auth-abac-examples
    f"((!(ActionMatches{{'{B}/blobs/read'}})) OR (@Resource[{B}:name] StringEquals 'blobs-example-container'))",
    f"((!(ActionMatches{{'{B}/blobs/read'}} AND SubOperationMatches{{'Blob.Read.WithTagConditions'}})) OR "
    f"(@Resource[{B}/blobs/tags:Project<$key_case_sensitive$>] StringEquals 'Cascade'))",
    f"((!(ActionMatches{{'{B}/blobs/write'}} AND SubOperationMatches{{'Blob.Write.WithTagHeaders'}})) OR "
    f"(@Request[{B}/blobs/tags&$keys$&] ForAllOfAnyValues:StringEquals {{'Project', 'Program'}}))",
    f"((!(ActionMatches{{'{B}/blobs/read'}} AND NOT SubOperationMatches{{'Blob.List'}})) OR "
    f"(@Resource[{B}:name] StringEquals 'c' AND @Resource[{B}/blobs:path] StringLike 'readonly/*'))",
    "{'red', 'blue'} ForAnyOfAnyValues:StringEquals {'blue', 'green'}",
    "{10, 20} ForAllOfAllValues:NumericLessThan {25, 30}",
    f"(Exists @Request[{B}/blobs:snapshot]) || @Resource[{B}/blobs:isCurrentVersion] BoolEquals true",
]


@pytest.mark.parametrize("text", DOCUMENTED)
def test_documented_examples_parse(text):
    assert grammar.parse(text).kind in ("or", "and", "compare")


@pytest.mark.parametrize("text, says", [
    ("a AND b OR c", "expected an attribute or a value"),
    (f"@Resource[{B}:name] StringEquals 'a' AND @Resource[{B}:name] StringEquals 'b' OR "
     f"@Resource[{B}:name] StringEquals 'c'", "mixed without parentheses"),
    (f"@Resource[{B}:name] StringIs 'a'", "unknown operator"),
    (f"@Resource[{B}:name] ForSomeValues:StringEquals 'a'", "unknown operator"),
    (f"@Tenant[{B}:name] StringEquals 'a'", "unknown attribute source"),
    (f"((!(ActionMatches{{'{B}/blobs/read'}})) OR (@Resource[{B}:name] StringEquals 'a')", "expected )"),
    (f"ActionMatches{{{B}/blobs/read}}", "unexpected"),
    ("", "empty"),
    (f"@Resource[{B}:name] StringEquals 'a' )", "after a complete condition"),
])
def test_what_the_grammar_refuses(text, says):
    with pytest.raises(ConditionSyntaxError) as caught:
        grammar.parse(text)
    assert says in str(caught.value)


def test_documented_operator_examples_evaluate():
    """The results table of conditions-format's "Operator examples"."""
    cases = {"{'red', 'blue'} ForAnyOfAnyValues:StringEquals {'blue', 'green'}": True,
             "{'red', 'blue'} ForAnyOfAnyValues:StringEquals {'orange', 'green'}": False,
             "{'red', 'blue'} ForAllOfAnyValues:StringEquals {'orange', 'red', 'blue'}": True,
             "{'red', 'blue'} ForAllOfAnyValues:StringEquals {'red', 'green'}": False,
             "{10, 20} ForAnyOfAllValues:NumericLessThan {15, 18}": True,
             "{10, 20} ForAllOfAllValues:NumericLessThan {5, 15, 18}": False,
             "{10, 20} ForAllOfAllValues:NumericLessThan {25, 30}": True,
             "{10, 20} ForAllOfAllValues:NumericLessThan {15, 25, 30}": False,
             # negated functions compare pair by pair: some value differs from some other value
             "{'red', 'blue'} ForAnyOfAnyValues:StringNotEquals {'red'}": True,
             "{'red'} ForAnyOfAnyValues:StringNotEquals {'red'}": False,
             "'Ocean' StringNotEqualsIgnoreCase 'ocean'": False,
             "'ocean/run1' StringNotStartsWith 'clinic/'": True}
    for text, want in cases.items():
        assert grammar.evaluate(grammar.parse(text), Request("x")) is want, text
    action = grammar.parse("ActionMatches{'Microsoft.Authorization/roleAssignments/*'}")
    assert grammar.evaluate(action, Request("Microsoft.Authorization/roleAssignments/write"))
    assert not grammar.evaluate(action, Request("Microsoft.Authorization/roleDefinitions/write"))


@pytest.mark.parametrize("write, operator", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("project", ["ocean", "a", "clinic-2026", "x" * 63])
def test_every_generated_condition_parses(project, write, operator):
    tree = grammar.parse(condition(project, write=write, operator=operator))
    assert tree.kind == "and" and len(tree.args) == (3 if write else 2)


@pytest.mark.parametrize("bad", ["", "Ocean", "o'cean", "-ocean", "ocean-", "a/b", "x" * 64, "ocean' OR 'a"])
def test_a_project_that_cannot_be_quoted_is_refused(bad):
    with pytest.raises(BadProject):
        check_project(bad)


def test_the_deployments_payloads_condition_parses_and_keeps_payloads_read_only():
    """bicep/modules/rbac.bicep's condition on every account-wide write role, through the same grammar."""
    import re
    from pathlib import Path

    from upwell.access.conditions import BLOB_PATH, CONTAINER_NAME

    bicep = (Path(__file__).resolve().parents[2] / "bicep" / "modules" / "rbac.bicep").read_text()
    text = re.search(r"^var payloadsReadOnly = '(.*)'$", bicep, re.M).group(1)
    text = text.replace("\\'", "'").replace("${payloadsContainerName}", "payloads")
    tree = grammar.parse(text)

    def writes(container: str) -> bool:
        return grammar.evaluate(tree, Request(f"{B}/blobs/write", attributes={
            ("Resource", CONTAINER_NAME): container, ("Resource", BLOB_PATH): "x.yaml"}))

    assert not writes("payloads") and writes("results") and writes("incoming")
    assert grammar.evaluate(tree, Request(f"{B}/blobs/read", attributes={("Resource", CONTAINER_NAME): "payloads"}))
