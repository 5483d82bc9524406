"""Run the IaC tools that live in .venv-iac from the main venv (tests use this).

The IaC venv is separate because checkov pins many packages tightly; `make
iac-install` creates it from bicep/requirements-iac.txt. When it is missing,
``iac_python`` raises IacVenvMissing: a test must fail then, not skip.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("UPWELL_IAC_VENV", ROOT / ".venv-iac"))
BAD_DIR = ROOT / "tests" / "data" / "bicep_bad"
CUSTOM_CHECKS = ("CKV_UPW_1", "CKV_UPW_2", "CKV_UPW_3", "CKV_UPW_4", "CKV_UPW_5", "CKV_UPW_6", "CKV_UPW_7",
                 "CKV_UPW_8")


class IacVenvMissing(RuntimeError):
    pass


def iac_bin(name: str) -> Path:
    path = VENV / "bin" / name
    if not path.exists():
        raise IacVenvMissing(f"{path} is missing: run `make iac-install` (creates {VENV} from "
                             f"bicep/requirements-iac.txt)")
    return path


def bicep_files() -> list[Path]:
    return sorted((ROOT / "bicep").rglob("*.bicep"))


def bicep_json(paths: list[Path] | None = None) -> dict[str, dict]:
    """{path relative to the repo: pycep tree} for the given files (default: all under bicep/)."""
    paths = paths or bicep_files()
    proc = subprocess.run([str(iac_bin("python")), str(ROOT / "bicep" / "tools" / "bicep_json.py"),
                           *map(str, paths)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    if proc.returncode != 0:
        raise AssertionError(f"pycep could not parse:\n{proc.stderr}")
    trees = json.loads(proc.stdout)
    return {str(Path(k).resolve().relative_to(ROOT)): v for k, v in trees.items()}


def checkov(*args: str) -> tuple[int, dict, str]:
    """Run checkov with JSON output; (exit status, the bicep report, stderr)."""
    proc = subprocess.run([str(iac_bin("checkov")), *args, "--output", "json", "--skip-download"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"checkov printed no JSON (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-3000:]}") from None
    reports = report if isinstance(report, list) else [report]
    bicep = next((r for r in reports if r.get("check_type") == "bicep"), None)
    if bicep is None:
        # checkov prints a bare summary when nothing matched
        bicep = {"results": {"passed_checks": [], "failed_checks": [], "skipped_checks": []},
                 "summary": reports[0] if reports else {}}
    return proc.returncode, bicep, proc.stderr
