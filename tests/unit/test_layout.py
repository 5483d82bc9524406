"""The dependency rules of the layout (docs/architecture.md), checked on the source itself.

- ``handlers`` is imported only by ``function_app.py`` (and by handlers themselves);
- ``azure.functions`` is imported only in ``handlers/``, ``upwell/local/devhost/`` and ``function_app.py``;
- ``workers/`` never imports ``handlers`` (nor does ``upwell/``);
- ``upwell/results/`` never imports ``upwell/scale/``;
- the autoscaler decides and the pools act: ``upwell/pools/`` never imports ``upwell/scale/``, and
  ``upwell/scale/`` imports of the pools only their contract (``upwell.pools.base``) and ``make_pool``;
- no import circles, counting imports made inside functions (an import inside a function still ties
  the two modules together; only imports under ``if TYPE_CHECKING`` are left out);
- no ``.py`` file under ``upwell/`` or ``workers/`` over 500 lines, and ``workers/agent.py`` at most 200.

Each rule is also shown to fail on an import (or a file) planted in a copy of the tree.
"""

from __future__ import annotations

import ast
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("upwell", "workers", "handlers")

MAX_LINES = 500
MAX_LINES_OF = {"workers/agent.py": 200}  # the agent's entrypoint reads as the flow: a short loop


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, e.g. upwell.results.collect
    target: str  # the imported module, e.g. upwell.scale.policy
    eager: bool  # at module level (not in a function, not under TYPE_CHECKING)
    line: int
    typing_only: bool = False  # under ``if TYPE_CHECKING``: never runs, so it ties no circle


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
    """Every import in ``source``, with whether it runs when the module is imported and whether
    it sits under ``if TYPE_CHECKING`` (then it never runs at all)."""
    out: list[Import] = []

    def walk(nodes, eager: bool, typing_only: bool) -> None:
        for node in nodes:
            if isinstance(node, ast.Import | ast.ImportFrom):
                out.extend(Import(module, t, eager, node.lineno, typing_only)
                           for t in _targets(node, module, is_package))
            elif isinstance(node, ast.If) and _is_type_checking(node):
                walk(node.body, False, True)
                walk(node.orelse, eager, typing_only)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                walk(ast.iter_child_nodes(node), False, typing_only)
            else:
                walk(ast.iter_child_nodes(node), eager, typing_only)

    walk(ast.parse(source).body, True, False)
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


def circles(imports: list[Import]) -> list[frozenset[str]]:
    """The import circles among the repository's own modules: each a strongly connected set of
    modules, counting imports inside functions but not those under ``if TYPE_CHECKING``."""
    modules = {i.module for i in imports}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for i in imports:
        # a submodule naming its own package ("from pkg import sibling") is no circle: the
        # package's __init__ has already started when any of its submodules is imported
        if not i.typing_only and i.target in modules and not _under(i.module, i.target):
            graph[i.module].add(i.target)
    return _strongly_connected(graph)


def _strongly_connected(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Tarjan's algorithm, iterative (the module graph is deep enough to matter); sets of two or more."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    part = stack[stack.index(node):]
                    del stack[stack.index(node):]
                    if len(part) > 1:
                        found.append(frozenset(part))
            elif nxt not in index:
                index[nxt] = low[nxt] = len(index)
                stack.append(nxt)
                work.append((nxt, iter(sorted(graph[nxt]))))
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
    return found


def check(root: Path) -> list[str]:
    imports = scan(root)
    return rule_violations(imports) + [" <-> ".join(sorted(c)) + ": import circle" for c in circles(imports)]


def long_files(root: Path) -> dict[str, int]:
    """The ``.py`` files under upwell/ and workers/ over their line limit, with their line counts."""
    over = {}
    for pkg in ("upwell", "workers"):
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > MAX_LINES_OF.get(rel, MAX_LINES):
                over[rel] = lines
    return over


def test_the_tree_keeps_the_dependency_rules():
    imports = scan(REPO)
    assert len({i.module for i in imports}) > 50  # the scan saw the tree
    assert check(REPO) == []


def test_no_file_grows_past_its_line_limit():
    over = long_files(REPO)
    assert len(list((REPO / "upwell").rglob("*.py"))) > 50  # the count saw the tree
    assert over == {}, f"over {MAX_LINES} lines (agent.py: 200): {over}"


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
    ("upwell/pools/batch.py", "from upwell.scale.policy import decide", "pools/ act and never import scale/"),
    ("upwell/pools/process.py", "def f():\n    import upwell.scale.autoscaler", "pools/ act and never import scale/"),
    ("upwell/scale/autoscaler.py", "from upwell.pools.batch import BatchPool", "scale/ imports only the pool contract"),
    ("upwell/scale/policy.py", "def f():\n    from upwell.pools import aci", "scale/ imports only the pool contract"),
    ("upwell/names.py", "from upwell import ledger", "import circle"),
])
def test_a_planted_forbidden_import_fails(tree, rel, line, says):
    _plant(tree, rel, line)
    problems = check(tree)
    assert any(says in p for p in problems), problems


def test_an_import_inside_a_function_closes_a_circle(tree):
    _plant(tree, "upwell/names.py", "def f():\n    from upwell import ledger")
    problems = check(tree)
    assert any("upwell.ledger" in p and "upwell.names" in p and p.endswith(": import circle")
               for p in problems), problems


def test_a_type_checking_import_makes_no_circle(tree):
    _plant(tree, "upwell/errors.py",
           "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from upwell import storage")
    _plant(tree, "upwell/names.py",
           "import typing\nif typing.TYPE_CHECKING:\n    def f():\n        from upwell import ledger")
    assert check(tree) == []


def test_circles_are_whole_strongly_connected_sets():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}, "f": {"g"}, "g": {"f"}}
    assert sorted(map(sorted, _strongly_connected(graph))) == [["a", "b", "c"], ["f", "g"]]


def test_a_planted_long_file_fails(tree):
    (tree / "workers" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1), encoding="utf-8")
    (tree / "upwell" / "short.py").write_text("x = 1\n" * MAX_LINES, encoding="utf-8")
    agent = tree / "workers" / "agent.py"
    over = long_files(tree)
    assert over["workers/long.py"] == MAX_LINES + 1
    assert "upwell/short.py" not in over
    agent.write_text("x = 1\n" * 201, encoding="utf-8")
    assert long_files(tree)["workers/agent.py"] == 201
    agent.write_text("x = 1\n" * 200, encoding="utf-8")
    assert "workers/agent.py" not in long_files(tree)


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
