"""The dependency rules of the layout (docs/architecture.md), checked on the source itself.

- ``handlers`` is imported only by ``function_app.py`` (and by handlers themselves);
- ``azure.functions`` is imported only in ``handlers/``, ``upwell/local/devhost/`` and ``function_app.py``;
- ``workers/`` never imports ``handlers`` (nor does ``upwell/``);
- ``upwell/results/`` never imports ``upwell/scale/``;
- the autoscaler decides and the pools act: ``upwell/pools/`` never imports ``upwell/scale/``, and
  ``upwell/scale/`` imports of the pools only their contract (``upwell.pools.base``) and ``make_pool``;
- no import cycles among the modules' top-level imports (imports under ``if TYPE_CHECKING``
  and inside functions are lazy and do not count for cycles; they do for the other rules).

Each rule is also shown to fail on an import planted in a copy of the tree.
"""

from __future__ import annotations

import ast
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("upwell", "workers", "handlers")


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, e.g. upwell.results.collect
    target: str  # the imported module, e.g. upwell.scale.policy
    eager: bool  # at module level (not in a function, not under TYPE_CHECKING)
    line: int


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:  # relative: resolve against the importing package
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, base] if base else package)
    # "from pkg import name" may import the submodule pkg.name: count both
    return [base, *(f"{base}.{a.name}" for a in node.names)]


def imports_of(source: str, module: str, is_package: bool = False) -> list[Import]:
    """Every import in ``source``, with whether it runs when the module is imported."""
    out: list[Import] = []

    def walk(nodes, eager: bool) -> None:
        for node in nodes:
            if isinstance(node, ast.Import | ast.ImportFrom):
                out.extend(Import(module, t, eager, node.lineno) for t in _targets(node, module, is_package))
            elif isinstance(node, ast.If) and _is_type_checking(node):
                walk(node.body, False)
                walk(node.orelse, eager)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                walk(ast.iter_child_nodes(node), False)
            else:
                walk(ast.iter_child_nodes(node), eager)

    walk(ast.parse(source).body, True)
    return out


def scan(root: Path) -> list[Import]:
    found = []
    files = [root / "function_app.py"] + [p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))]
    for path in files:
        if path.exists():
            found.extend(imports_of(path.read_text(encoding="utf-8"), _module_name(root, path),
                                    path.name == "__init__.py"))
    return found


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _pool_contract(target: str) -> bool:
    """What the autoscaler may know of the pools: the contract module and the one factory."""
    return target in ("upwell.pools", "upwell.pools.make_pool") or _under(target, "upwell.pools.base")


def rule_violations(imports: list[Import]) -> list[str]:
    bad = []
    for i in imports:
        where = f"{i.module}:{i.line} imports {i.target}"
        if _under(i.target, "handlers") and not (i.module == "function_app" or _under(i.module, "handlers")):
            bad.append(f"{where}: handlers are imported only by function_app.py")
        if _under(i.target, "azure.functions") and not (
                i.module == "function_app" or _under(i.module, "handlers") or _under(i.module, "upwell.local.devhost")):
            bad.append(f"{where}: azure.functions belongs to handlers/ and upwell/local/devhost/")
        if _under(i.module, "upwell.results") and _under(i.target, "upwell.scale"):
            bad.append(f"{where}: results/ never imports scale/")
        if _under(i.module, "upwell.pools") and _under(i.target, "upwell.scale"):
            bad.append(f"{where}: pools/ act and never import scale/")
        if _under(i.module, "upwell.scale") and _under(i.target, "upwell.pools") and not _pool_contract(i.target):
            bad.append(f"{where}: scale/ imports only the pool contract (pools.base) and make_pool")
    return bad


def cycles(imports: list[Import]) -> list[list[str]]:
    """Cycles in the graph of eager imports between the repository's own modules."""
    modules = {i.module for i in imports}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for i in imports:
        # a submodule naming its own package ("from pkg import sibling") is no cycle: the
        # package's __init__ has already started when any of its submodules is imported
        if i.eager and i.target in modules and not _under(i.module, i.target):
            graph[i.module].add(i.target)
    found, state, stack = [], dict.fromkeys(modules, 0), []  # 0 new, 1 on the stack, 2 done

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state[n] == 1:
                found.append(stack[stack.index(n):] + [n])
            elif state[n] == 0:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(modules):
        if state[m] == 0:
            visit(m)
    return found


def check(root: Path) -> list[str]:
    imports = scan(root)
    return rule_violations(imports) + [" -> ".join(c) + ": import cycle" for c in cycles(imports)]


def test_the_tree_keeps_the_dependency_rules():
    imports = scan(REPO)
    assert len({i.module for i in imports}) > 50  # the scan saw the tree
    assert check(REPO) == []


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    """A copy of the repository's Python sources, to plant imports in."""
    shutil.copy2(REPO / "function_app.py", tmp_path / "function_app.py")
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    assert check(tmp_path) == []
    return tmp_path


def _plant(root: Path, rel: str, line: str) -> None:
    path = root / rel
    path.write_text(path.read_text(encoding="utf-8") + f"\n{line}\n", encoding="utf-8")


@pytest.mark.parametrize("rel, line, says", [
    ("upwell/results/collect.py", "from upwell.scale import policy", "results/ never imports scale/"),
    ("upwell/results/report/summary.py", "def f():\n    import upwell.scale.autoscaler",
     "results/ never imports scale/"),
    ("workers/agent.py", "from handlers import context", "handlers are imported only by function_app.py"),
    ("upwell/ledger.py", "import handlers.scale", "handlers are imported only by function_app.py"),
    ("upwell/ingest/ingestor.py", "import azure.functions as func", "azure.functions belongs to"),
    ("workers/launch.py", "from azure.functions import HttpRequest", "azure.functions belongs to"),
    ("upwell/names.py", "from upwell import ledger", "import cycle"),
    ("upwell/pools/batch.py", "from upwell.scale.policy import decide", "pools/ act and never import scale/"),
    ("upwell/pools/process.py", "def f():\n    import upwell.scale.autoscaler", "pools/ act and never import scale/"),
    ("upwell/scale/autoscaler.py", "from upwell.pools.batch import BatchPool", "scale/ imports only the pool contract"),
    ("upwell/scale/policy.py", "def f():\n    from upwell.pools import aci", "scale/ imports only the pool contract"),
])
def test_a_planted_forbidden_import_fails(tree, rel, line, says):
    _plant(tree, rel, line)
    problems = check(tree)
    assert any(says in p for p in problems), problems


def test_lazy_and_type_checking_imports_make_no_cycle(tree):
    _plant(tree, "upwell/names.py", "def f():\n    from upwell import ledger")
    _plant(tree, "upwell/errors.py",
           "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from upwell import storage")
    assert check(tree) == []


def test_relative_imports_resolve():
    got = imports_of("from . import base\nfrom ..errors import X", "upwell.pools.process")
    assert {i.target for i in got} >= {"upwell.pools.base", "upwell.errors", "upwell.errors.X"}


def test_the_repository_tracks_no_links_and_no_local_environment():
    """Local environments (.venv, node_modules) are built by make, never tracked; a tracked link to one
    would replace the real folder on checkout (git treats ignored folders as expendable)."""
    import subprocess

    out = subprocess.run(["git", "ls-files", "-s"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    links = [line.split("\t", 1)[1] for line in out.splitlines() if line.startswith("120000 ")]
    assert not links, f"tracked symbolic links: {links}"
    tracked = {line.split("\t", 1)[1].split("/", 1)[0] for line in out.splitlines()}
    assert not tracked & {".venv", ".venv-iac", "node_modules", ".upwell"}, tracked & {".venv", "node_modules"}
