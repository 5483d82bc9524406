"""Manifest and rule validation: errors name the field, row or limit."""

import json

import pytest

from upwell.errors import InputRejected
from upwell.ingest.manifests import grid_points, load_manifest, load_rule


def _m(**kw):
    doc = {"payload": "logistic", "grid": {"r": [3.0, 3.5]}, **kw}
    return json.dumps(doc).encode()


def test_valid_manifest_expands_grid():
    m = load_manifest(b"payload: logistic\nparams: {steps: 100}\ngrid: {r: [2.5, 3.5], x0: [0.1, 0.2, 0.3]}\n",
                      "job.yaml")
    points = grid_points(m, max_shards=100, max_param_bytes=1000)
    assert len(points) == 6 and points[0] == {"steps": 100, "r": 2.5, "x0": 0.1}


@pytest.mark.parametrize("doc, field, text", [
    (_m(payload="rm -rf"), "payload", "unknown payload"),
    (_m(command="bash"), "command", "Extra inputs are not permitted"),
    (_m(resources={"ranks": 0}), "resources.ranks", "greater than or equal to 1"),
    (_m(budget_usd=-1), "budget_usd", "greater than or equal to 0"),
    (_m(grid={"r": []}), "grid", "grid.r is empty"),
])
def test_bad_manifest_names_field(doc, field, text):
    with pytest.raises(InputRejected) as err:
        load_manifest(doc, "job.json")
    assert err.value.field == field and text in err.value.message


def test_grid_point_error_names_row_and_field():
    m = load_manifest(_m(grid={"r": [3.0, 9.0]}), "job.json")
    with pytest.raises(InputRejected) as err:
        grid_points(m, 100, 1000)
    assert err.value.row == 1 and err.value.field == "grid.r"


def test_grid_product_over_limit_rejected_before_expansion():
    m = load_manifest(_m(grid={"r": [3.0] * 100, "x0": [0.5] * 100, "steps": [100] * 100}), "job.json")
    with pytest.raises(InputRejected) as err:
        grid_points(m, 10_000, 1000)
    assert err.value.limit == "max_shards=10000" and "1000000 points" in err.value.message


@pytest.mark.parametrize("text, field", [
    (b"a: &a [1,2]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
     b"d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,"
     b"*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,"
     b"*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]\n",
     "yaml"),
    (b"payload: !!python/object/apply:os.system ['echo owned']\n", "document"),
    (b"- just\n- a list\n", "document"),
    (b"", "document"),
    (b"payload: [unclosed\n", "document"),
])
def test_unsafe_or_malformed_yaml(text, field):
    with pytest.raises(InputRejected) as err:
        load_manifest(text, "job.yaml")
    assert err.value.field == field


def test_invalid_json_names_line():
    with pytest.raises(InputRejected) as err:
        load_manifest(b'{\n "payload": "logistic",\n}', "job.json")
    assert err.value.row == 3


def test_rule_matches_paths():
    rule = load_rule(b"match: 'instruments/buoy/*.csv'\npayload: welch\ncolumns: {time: float}\n", "r.yaml")
    assert rule.matches("instruments/buoy/a.csv") and not rule.matches("instruments/other/a.csv")
