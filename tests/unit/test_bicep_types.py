"""Every resource in bicep/ is checked against Azure's published resource types.

The type data is the one the Bicep compiler uses (Azure/bicep-types-az, kept in
tests/data/bicep_types with source path and commit); the checker is
bicep/tools/bicep_types.py. The templates are parsed by pycep in the IaC venv
(.venv-iac, `make iac-install`); without it these tests fail, they never skip.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bicep" / "tools"))

import bicep_types as bt  # noqa: E402
import upwell_iac as iac  # noqa: E402

DATA = ROOT / "tests" / "data" / "bicep_types"
SOURCE_PATH_RE = re.compile(
    r"^generated/[a-z0-9]+/(microsoft\.[a-z0-9]+)/([0-9]{4}-[0-9]{2}-[0-9]{2}(-preview)?)/types\.md$")


def _parse(paths: list[Path]) -> dict[str, dict]:
    """pycep trees for files anywhere (bicep_json.py in .venv-iac), keyed by file name."""
    try:
        python = iac.iac_bin("python")
    except iac.IacVenvMissing as exc:
        pytest.fail(str(exc))
    proc = subprocess.run([str(python), str(ROOT / "bicep" / "tools" / "bicep_json.py"), *map(str, paths)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return {Path(k).name: v for k, v in json.loads(proc.stdout).items()}


@pytest.fixture(scope="module")
def data():
    return bt.load_type_data()


@pytest.fixture(scope="module")
def report(data):
    try:
        trees = iac.bicep_json()
    except iac.IacVenvMissing as exc:
        pytest.fail(str(exc))
    return bt.check_trees(trees, data)


def _plant(tmp_path: Path, module: str, old: str, new: str) -> dict[str, dict]:
    text = (ROOT / "bicep" / "modules" / module).read_text()
    assert old in text, f"{module} no longer contains {old!r}; update the planted case"
    target = tmp_path / module
    target.write_text(text.replace(old, new, 1))
    return _parse([target])


# ---------------------------------------------------------------- the data


def test_type_data_names_its_source_and_commit():
    files = sorted(p for p in DATA.glob("*.md") if p.name != "README.md")
    assert files
    readme = (DATA / "README.md").read_text()
    for path in files:
        tf = bt.parse_type_file(path)
        assert tf.source_repo == "Azure/bicep-types-az", path
        m = SOURCE_PATH_RE.match(tf.source_path)
        assert m, f"{path.name}: unexpected source path {tf.source_path}"
        assert (m.group(1), m.group(2)) == (tf.namespace.lower(), tf.version), path.name
        assert path.name == f"{tf.namespace.lower()}@{tf.version}.md"
        assert re.fullmatch(r"[0-9a-f]{40}", tf.commit)
        assert f"`{tf.source_path}` | `{tf.commit}`" in readme, f"README.md does not list {path.name}"
        assert tf.resources, f"{path.name} keeps no resource section"


def test_templates_use_one_stable_version_per_resource_type(report):
    versions: dict[str, set[str]] = {}
    for _, _, rtype, version in report.resources:
        versions.setdefault(rtype, set()).add(version)
    for rtype, vs in versions.items():
        assert len(vs) == 1, f"{rtype} is used at several API versions: {sorted(vs)}"
        (version,) = vs
        if rtype != "Microsoft.Insights/diagnosticSettings":  # no stable version exists
            assert not version.endswith("-preview"), f"{rtype}@{version}"


def test_every_resource_has_type_data(report):
    missing = [str(f) for f in report.findings if f.message.startswith("no type data")]
    assert not missing, "\n".join(missing)


def test_templates_match_the_type_data(report):
    assert not report.findings, "\n".join(map(str, report.findings))
    # Not vacuous: every resource had its properties checked.
    assert len(report.resources) >= 60
    assert sum(report.checked.values()) >= 500
    for file, symbol, _, _ in report.resources:
        assert report.checked.get(f"{file}:{symbol}", 0) > 0, f"{file}:{symbol} was not checked"


def test_versions_the_issue_names(report):
    used = {(rtype, version) for _, _, rtype, version in report.resources}
    assert ("Microsoft.ContainerRegistry/registries", "2025-04-01") in used
    assert ("Microsoft.Batch/batchAccounts/pools", "2025-06-01") in used
    batch = (ROOT / "bicep" / "modules" / "batch.bicep").read_text()
    code = "\n".join(ln for ln in batch.splitlines() if not ln.strip().startswith("//"))
    assert "targetNodeCommunicationMode" not in code and "resourceTags" not in code


# ---------------------------------------------------------------- it fails when it should


def test_planted_misspelled_property_fails(tmp_path, data):
    trees = _plant(tmp_path, "registry.bicep", "adminUserEnabled", "adminUserEnabeld")
    found = [str(f) for f in bt.check_trees(trees, data).findings]
    assert any("'adminUserEnabeld' is not a property of RegistryProperties" in f for f in found), found


def test_planted_misspelling_deep_in_a_variable_fails(tmp_path, data):
    # The subnet is a variable, concatenated into the virtual network's subnets.
    trees = _plant(tmp_path, "network.bicep", "addressPrefix: workersPrefix", "adressPrefix: workersPrefix")
    found = [str(f) for f in bt.check_trees(trees, data).findings]
    assert any("properties.subnets[0].properties.adressPrefix" in f and "SubnetPropertiesFormat" in f
               for f in found), found


def test_properties_removed_from_batch_pools_fail(tmp_path, data):
    trees = _plant(tmp_path, "batch.bicep", "taskSlotsPerNode: 1",
                   "taskSlotsPerNode: 1\n    targetNodeCommunicationMode: 'Simplified'\n    resourceTags: tags")
    found = [str(f) for f in bt.check_trees(trees, data).findings]
    assert any("'targetNodeCommunicationMode' is not a property of PoolProperties" in f for f in found), found
    assert any("'resourceTags' is not a property of PoolProperties" in f for f in found), found


def test_anonymous_pull_needs_2025_04_01(tmp_path, data):
    trees = _plant(tmp_path, "registry.bicep", "registries@2025-04-01", "registries@2023-07-01")
    found = [str(f) for f in bt.check_trees(trees, data).findings]
    assert any("no type data for Microsoft.ContainerRegistry/registries@2023-07-01" in f for f in found), found


def test_wrong_enum_case_and_read_only_fail(tmp_path, data):
    trees = _plant(tmp_path, "functionapp.bicep", "instanceMemoryMB: instanceMemoryMB",
                   "instanceMemoryMb: instanceMemoryMB")
    site = trees["functionapp.bicep"]["resources"]["site"]["config"]["properties"]
    site["defaultHostName"] = "x"  # a read-only property of the site
    site["clientCertMode"] = "Sometimes"  # not one of the published values
    found = [str(f) for f in bt.check_trees(trees, data).findings]
    assert any("'instanceMemoryMb' differs only in case from 'instanceMemoryMB'" in f for f in found), found
    assert any("'defaultHostName' is read-only" in f for f in found), found
    assert any("'Sometimes' is not one of" in f for f in found), found


def test_discriminated_destination_and_required_properties(tmp_path, data):
    trees = _plant(tmp_path, "events.bicep", "endpointType: 'WebHook'", "endpointType: 'WebHooks'")
    found = [str(f) for f in bt.check_trees(trees, data).findings]
    assert any("properties.destination.endpointType: 'WebHooks' is not one of" in f for f in found), found
    trees = _plant(tmp_path, "budget.bicep", "timeGrain: 'Monthly'", "grain: 'Monthly'")
    found = [str(f) for f in bt.check_trees(trees, data).findings]
    assert any("required property 'timeGrain' of BudgetProperties is missing" in f for f in found), found


def test_cli_exit_status(tmp_path):
    """`bicep_types.py` (run by make iac-check) exits 1 and names the finding."""
    python = iac.iac_bin("python")
    bad = tmp_path / "registry.bicep"
    bad.write_text((ROOT / "bicep" / "modules" / "registry.bicep").read_text().replace("adminUserEnabled", "adminUser"))
    proc = subprocess.run([str(python), str(ROOT / "bicep" / "tools" / "bicep_types.py"), str(bad)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 1 and "'adminUser' is not a property" in proc.stderr, proc.stderr


def test_planted_misspelling_in_the_change_feed_conditional_fails(tmp_path, data):
    # The blob service's changeFeed is a conditional object (on where UPWELL_RECONCILE_SOURCE=changefeed).
    trees = _plant(tmp_path, "storage.bicep", "retentionInDays: changeFeedRetentionDays",
                   "retentionDays: changeFeedRetentionDays")
    found = [str(f) for f in bt.check_trees(trees, data).findings]
    assert any("properties.changeFeed.retentionDays" in f and "ChangeFeed" in f for f in found), found
