"""Parse Bicep files with pycep and print them as one JSON object {path: tree}.

Runs in the IaC venv (.venv-iac), where pycep-parser is installed:

    .venv-iac/bin/python bicep/tools/bicep_json.py             # every .bicep under bicep/
    .venv-iac/bin/python bicep/tools/bicep_json.py --check     # parse only; exit 1 on any failure
    .venv-iac/bin/python bicep/tools/bicep_json.py a.bicep ...

A file that does not parse is named on stderr with the parser's message, and
the exit status is 1. pycep knows fewer functions than the Bicep compiler
(for example cidrSubnet, toObject), so the templates keep to what it knows.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pycep import BicepParser

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str]) -> int:
    check_only = "--check" in argv
    args = [a for a in argv if a != "--check"]
    paths = [Path(a) for a in args] or sorted((ROOT / "bicep").rglob("*.bicep"))
    parser = BicepParser()
    trees: dict[str, object] = {}
    failed = 0
    for path in paths:
        try:
            trees[str(path)] = parser.parse(file_path=path)
        except Exception as exc:  # lark raises several types; all mean "does not parse"
            failed += 1
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            print(f"{path}: does not parse: {first}", file=sys.stderr)
    if check_only:
        print(f"pycep: {len(paths) - failed}/{len(paths)} Bicep files parse", file=sys.stderr)
    else:
        json.dump(trees, sys.stdout, default=str)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
