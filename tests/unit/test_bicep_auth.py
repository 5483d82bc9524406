"""The Function App's built-in authentication (issue 27): CKV_UPW_8 passes on bicep/'s Function App and
fails each way a template can leave the dashboard and the API open. One checkov run from the IaC venv
(.venv-iac); tests/unit/test_bicep.py runs it on bicep/ and on tests/data/bicep_bad as well."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bicep" / "tools"))

import upwell_iac as iac  # noqa: E402

pytestmark = pytest.mark.access
APP = ROOT / "bicep" / "modules" / "functionapp.bicep"


def _ckv8(directory: Path) -> tuple[set[str], set[str]]:
    try:
        iac.iac_bin("checkov")
    except iac.IacVenvMissing as exc:
        pytest.fail(str(exc))
    _, report, _ = iac.checkov("--directory", str(directory), "--framework", "bicep",
                               "--external-checks-dir", "bicep/checks", "--check", "CKV_UPW_8")
    res = report["results"]
    return ({f"{Path(c['file_path']).stem}:{c['resource']}" for c in res["passed_checks"]},
            {f"{Path(c['file_path']).stem}:{c['resource']}" for c in res["failed_checks"]})


def test_the_function_app_requires_entra_sign_in(tmp_path):
    """bicep/'s Function App passes; the same template fails when sign-in is optional, anonymous callers
    are let through, a dashboard path is excluded, the provider is off, or the config is gone."""
    text = APP.read_text(encoding="utf-8")
    broken = {
        "optional": text.replace("requireAuthentication: true", "requireAuthentication: false"),
        "anonymous": text.replace("unauthenticatedClientAction: 'RedirectToLoginPage'",
                                  "unauthenticatedClientAction: 'AllowAnonymous'"),
        "excluded": text.replace("'/runtime/webhooks/eventgrid'",
                                 "'/runtime/webhooks/eventgrid'\n        '/api/dashboard'"),
        "noprovider": text.replace("      azureActiveDirectory: {\n        enabled: true",
                                   "      azureActiveDirectory: {\n        enabled: false"),
        "gone": text.replace("name: 'authsettingsV2'", "name: 'web'"),
    }
    for name, variant in broken.items():
        assert variant != text, f"the {name} mutation changed nothing"
        (tmp_path / f"{name}.bicep").write_text(variant, encoding="utf-8")
    (tmp_path / "intact.bicep").write_text(text, encoding="utf-8")
    passed, failed = _ckv8(tmp_path)
    assert {"intact:Microsoft.Web/sites.site", "intact:Microsoft.Web/sites/config.auth"} <= passed
    assert not {f for f in failed if f.startswith("intact:")}
    for name in ("optional", "anonymous", "excluded", "noprovider"):
        assert f"{name}:Microsoft.Web/sites/config.auth" in failed, (name, failed)
    assert "gone:Microsoft.Web/sites.site" in failed, failed
