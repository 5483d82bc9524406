"""No dead code: every function, class and method defined in ``upwell/``, ``workers/`` or ``handlers/``
is referenced by production code, not only by tests.

A definition counts as referenced when its name is read anywhere in the production sources other than
in its own ``def``/``class`` line: as a name, an attribute, an imported name, or a string that names it
(``getattr(module, "run")``, ``"upwell.pools.process:LocalPool"``); or in the files that call code by name
(``pyproject.toml``'s scripts, the payload definitions, the Dockerfiles, the Makefile). A function under a
registering decorator (``@app.command()``, ``@bp.queue_trigger(...)``, ``@field_validator(...)``) is
called by its framework. Matching is by name, so the check rarely flags code that runs; a dead function
that shares its name with a live one goes unseen, which is the price of few false alarms.

What stays though no production code calls it is in ``WHITELIST``, each entry with its reason. Each
rule is shown to fail on a definition planted in the sources.
"""

from __future__ import annotations

import ast
import functools
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("upwell", "workers", "handlers")
# Files outside Python that call production code by name.
BY_NAME_FILES = ("pyproject.toml", "payloads/*.yaml", "workers/docker/*", "Makefile", "mk/*.mk", "host.json")
# Code that is no test and calls production code: the benchmarks (make bench).
CONSUMERS = ("bench",)
# Decorators that only wrap a function: a function under these alone is still called by its name.
TRANSPARENT = {"property", "setter", "staticmethod", "classmethod", "cached_property", "cache", "lru_cache",
               "abstractmethod", "contextmanager", "wraps", "overload", "dataclass", "override"}
# The whitelist, "path:name" -> why it stays though no production code calls it. Two kinds only:
# - the local stack's seams for driving it step by step: the local stack is the test bed, and these are its
#   controls (what a test sets or fires instead of waiting for the clock);
# - findings in another owner's module, reported to them: each goes when its owner deletes or routes it,
#   and test_every_whitelist_entry_is_still_needed then makes its entry go too.
WHITELIST = {
    "handlers/context.py:reset": "seam: tests change the environment, then drop the cached settings and clients",
    "upwell/local/devhost/host.py:invocations": "seam: the host's record of what ran, read by the fault tests",
    "upwell/local/devhost/host.py:run_until_idle": "seam: drive the host round by round instead of by its clock",
    "upwell/local/devhost/host.py:fire_timer": "seam: fire a timer function now instead of at its schedule",
    "upwell/local/devhost/publisher.py:set_faults": "seam: the event faults the fault tests inject",
    "upwell/local/slurm_cluster.py:start_rest": "seam: slurmrestd for the SlurmPool's REST path (up uses sbatch)",
}
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Definition:
    name: str
    path: str  # relative to the repository
    line: int

    @property
    def key(self) -> str:
        return f"{self.path}:{self.name}"


def production_files(root: Path) -> list[Path]:
    files = [root / "function_app.py"] + [p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))]
    return [p for p in files if p.exists()]


def _decorator_name(node: ast.expr) -> str:
    node = node.func if isinstance(node, ast.Call) else node
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def _registered(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """True if a decorator hands the function to a framework (which calls it without naming it here)."""
    return any(_decorator_name(d) not in TRANSPARENT for d in node.decorator_list)


def definitions(tree: ast.AST, where: str) -> list[Definition]:
    """Module-level functions and classes, and the methods of classes, that our code would have to call."""
    out = []

    def visit(body, in_class: bool) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                out.append(Definition(node.name, where, node.lineno))
                visit(node.body, True)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                dunder = node.name.startswith("__") and node.name.endswith("__")
                if not dunder and not _registered(node):
                    out.append(Definition(node.name, where, node.lineno))

    visit(tree.body, False)
    return out


def _path_names(text: str) -> list[str]:
    """The segments of a dotted or colon path in a string ("upwell.pools.process:LocalPool")."""
    if len(text) > 200 or not re.fullmatch(r"\w+(?:[.:]\w+)+", text):
        return []
    return IDENT.findall(text)


def _dispatch_prefix(node: ast.JoinedStr) -> str | None:
    """"_on_" for f"_on_{kind}": a name built from a fixed prefix and a value (getattr dispatch)."""
    if len(node.values) == 2 and isinstance(node.values[0], ast.Constant) and \
            isinstance(node.values[1], ast.FormattedValue) and IDENT.fullmatch(str(node.values[0].value)):
        return str(node.values[0].value)
    return None


def _attr_by_name(node: ast.Call) -> str | None:
    """"run" for getattr(module, "run") (and hasattr, setattr)."""
    if isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr", "setattr") and \
            len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
        return node.args[1].value
    return None


def references(tree: ast.AST) -> Counter:
    """How often each name is read in one module: names, attributes, imported names, the segments of
    import-path strings, getattr's names, and prefix + string for an f"prefix{value}" built in the module
    (``getattr(self, f"_on_{kind}")`` reaches ``_on_arrive`` when "arrive" is one of the module's strings).
    A bare word in a string ("egress" as a dict key) is data, not a reference."""
    seen: Counter = Counter()
    prefixes, words = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            seen[node.id] += 1
        elif isinstance(node, ast.Attribute):
            seen[node.attr] += 1
        elif isinstance(node, ast.alias):
            seen[node.name.rsplit(".", 1)[-1]] += 1
        elif isinstance(node, ast.Call) and _attr_by_name(node):
            seen[_attr_by_name(node)] += 1
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            seen.update(_path_names(node.value))
            if IDENT.fullmatch(node.value):
                words.add(node.value)
        elif isinstance(node, ast.JoinedStr) and _dispatch_prefix(node):
            prefixes.add(_dispatch_prefix(node))
    seen.update(p + w for p in prefixes for w in words)
    return seen


def by_name_references(root: Path) -> Counter:
    seen: Counter = Counter()
    for pattern in BY_NAME_FILES:
        for path in root.glob(pattern):
            if path.is_file():
                seen.update(IDENT.findall(path.read_text(encoding="utf-8", errors="replace")))
    return seen


@functools.cache
def _scan(rel: str, text: str) -> tuple[tuple[Definition, ...], Counter]:
    """One source's definitions and references; cached, so the planted-definition tests rescan only the
    file they plant in."""
    tree = ast.parse(text)
    return tuple(definitions(tree, rel)), references(tree)


def unreferenced(root: Path, planted: dict[str, str] | None = None) -> list[Definition]:
    """Definitions that no production code (nor a benchmark, nor a by-name file) references;
    ``planted`` adds source text to the end of files (relative path -> text), for the tests of the check."""
    planted = planted or {}

    def scan(path: Path) -> tuple[tuple[Definition, ...], Counter]:
        rel = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8")
        return _scan(rel, text + "\n\n" + planted[rel] + "\n" if rel in planted else text)

    defs: list[Definition] = []
    seen = by_name_references(root)
    for path in production_files(root):
        found, refs = scan(path)
        defs.extend(found)
        seen.update(refs)
    for path in (p for c in CONSUMERS for p in sorted((root / c).rglob("*.py"))):
        seen.update(scan(path)[1])
    return [d for d in defs if not seen[d.name]]


def dead(root: Path, planted: dict[str, str] | None = None) -> list[str]:
    """The unreferenced definitions that the whitelist does not keep, as 'path:line name'."""
    return [f"{d.path}:{d.line} {d.name}" for d in unreferenced(root, planted) if d.key not in WHITELIST]


def test_no_production_definition_is_referenced_only_from_tests():
    assert len(production_files(REPO)) > 50  # the scan saw the tree
    assert dead(REPO) == [], "defined in production, referenced by no production code (delete it, or " \
                             "route production through it)"


def test_every_whitelist_entry_is_still_needed():
    """An entry for a definition that is gone, or that production now calls, would hide the next dead
    one of that name: it goes."""
    assert sorted(d.key for d in unreferenced(REPO) if d.key in WHITELIST) == sorted(WHITELIST)


@pytest.mark.parametrize("rel, text, name", [
    ("upwell/pools/build_batch.py", "def planted_task(spec):\n    return spec", "planted_task"),
    ("upwell/pools/batch.py", "class PlantedBuilder:\n    pass", "PlantedBuilder"),
    ("workers/runner.py", "class Holder:\n    def planted_method(self):\n        return 1\n\n\nHolder()",
     "planted_method"),
    ("handlers/context.py", "@staticmethod\ndef planted_static():\n    return 1", "planted_static"),
])
def test_a_planted_unreferenced_definition_fails(rel, text, name):
    found = dead(REPO, {rel: text})
    assert [p for p in found if p.endswith(f" {name}")], found


def test_a_reference_from_production_code_or_by_name_keeps_a_definition():
    assert dead(REPO, {
        "upwell/pools/build_batch.py": "def planted_task(spec):\n    return spec",
        "upwell/pools/batch.py": "def _use(spec):\n    return build.planted_task(spec)\n\n\n_use(None)",
        "workers/runner.py": "def planted_entry():\n    return 1\n\n\nENTRY = 'workers.runner:planted_entry'",
        "handlers/context.py": "@registry.command()\ndef planted_command():\n    return 1",
        "upwell/scale/poolsim.py": "class Planted:\n    def _on_planted(self):\n        return 1\n\n"
                                    "    def go(self, kind):\n        return getattr(self, f'_on_{kind}')()\n\n\n"
                                    "Planted().go('planted')",
    }) == []
