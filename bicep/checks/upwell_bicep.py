"""Helpers shared by upwell's custom checkov checks for Bicep.

checkov hands a resource check the raw pycep JSON of one resource: a tag value
such as ``tags: tags`` arrives as the bare name ``"tags"``. To check tags for
real, ``tag_keys`` follows that name to the variable or parameter it names and,
for a module parameter, to every ``module`` call that passes it (the nearest
folder above the file that holds a ``main.bicep`` is the search root). It
answers with the set of keys the tags are certain to have, or None when an
expression is beyond it (which the checks treat as a failure).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from pycep import BicepParser

REQUIRED_TAGS = ("project", "owner", "environment", "expiry")

_WRAPPER_KEYS = {"loop_type", "condition", "config"}


def unwrap(conf: Any) -> Any:
    """The resource body inside pycep's loop / condition wrappers."""
    while isinstance(conf, dict) and "config" in conf and set(conf) <= _WRAPPER_KEYS:
        conf = conf["config"]
    return conf


def scanned_file(check: Any) -> Path | None:
    """The file checkov is scanning (BaseCheck sets entity_path to file:type:name)."""
    path = getattr(check, "entity_path", "") or ""
    parts = path.rsplit(":", 2)
    return Path(parts[0]).resolve() if len(parts) == 3 and parts[0] else None


@functools.cache
def _parser() -> BicepParser:
    return BicepParser()


@functools.cache
def parse(path: Path) -> dict[str, Any]:
    return _parser().parse(file_path=path)


def _root(path: Path) -> Path:
    for parent in list(path.parents)[:3]:
        if (parent / "main.bicep").is_file():
            return parent
    return path.parent


@functools.cache
def _callers(path: Path) -> tuple[tuple[Path, dict[str, Any]], ...]:
    """Every (file, params) of a `module` call whose path is `path`."""
    found = []
    for candidate in sorted(_root(path).rglob("*.bicep")):
        try:
            modules = parse(candidate.resolve()).get("modules") or {}
        except Exception:  # a file that does not parse is reported by the parse step
            continue
        for module in modules.values():
            target = (module.get("detail") or {}).get("path")
            if not target or (candidate.parent / target).resolve() != path:
                continue
            params = unwrap(module.get("config") or {}).get("params") or {}
            found.append((candidate.resolve(), params))
    return tuple(found)


def tag_keys(expr: Any, path: Path | None, depth: int = 0) -> frozenset[str] | None:
    """The keys an object expression is certain to have, or None if unknown."""
    if depth > 12:
        return None
    if isinstance(expr, dict):
        if set(expr) == {"function"}:
            func = expr["function"]
            if func.get("type") == "union":
                known = [tag_keys(arg, path, depth + 1) for arg in (func.get("parameters") or {}).values()]
                known = [k for k in known if k is not None]
                return frozenset().union(*known) if known else None
            return None
        if set(expr) == {"operator"}:
            op = expr["operator"]
            if op.get("type") == "conditional":
                both = [tag_keys(op["operands"].get(side), path, depth + 1) for side in ("true_value", "false_value")]
                return None if None in both else both[0] & both[1]
            return None
        return frozenset(expr)
    if isinstance(expr, str) and path is not None and expr.isidentifier():
        return _name_keys(expr, path, depth + 1)
    return None


def _name_keys(name: str, path: Path, depth: int) -> frozenset[str] | None:
    doc = parse(path)
    variables = doc.get("variables") or {}
    if name in variables:
        return tag_keys(variables[name].get("value"), path, depth)
    parameters = doc.get("parameters") or {}
    if name not in parameters:
        return None
    answers = []
    for caller, params in _callers(path):
        value = params.get(name, parameters[name].get("default"))
        answers.append(tag_keys(value, caller, depth))
    if not answers:
        default = parameters[name].get("default")
        return tag_keys(default, path, depth) if default is not None else None
    if None in answers:
        return None
    return frozenset.intersection(*answers)
