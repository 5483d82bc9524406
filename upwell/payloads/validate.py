"""Check a definition document and report every problem with its path in the file.

``problems`` never raises on bad content; ``load`` raises ``DefinitionError``
with all of them. The five common mistakes get a named code (see
``upwell.payloads.definition``); everything else from the model is ``invalid``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from upwell.documents import parse_document
from upwell.errors import InputRejected
from upwell.payloads.definition import (
    BUILTINS,
    DIGEST,
    Definition,
    content_hash,
    placeholders,
    registry_allowed,
    registry_of,
)
from upwell.payloads.params import check_value

ARGV_PATHS = ("command", "checkpoint.resume")


@dataclass(frozen=True)
class Problem:
    code: str
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message} [{self.code}]"


class DefinitionError(InputRejected):
    """A definition that cannot be used; ``problems`` lists each one with its path."""

    def __init__(self, source: str, problems: list[Problem]):
        first = problems[0]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(f"{source}: {first}{more}", field=first.path, source=source)
        self.problems = problems
        self.code = first.code


@dataclass(frozen=True)
class Loaded:
    """A valid definition with its content hash (sha256 of the file's bytes) and where it came from."""

    definition: Definition
    sha256: str
    source: str
    builtin: bool = False

    @property
    def ref(self) -> str:
        return f"{self.definition.name}@{self.definition.version}"


def _get(doc: Any, *keys: Any) -> Any:
    for key in keys:
        if isinstance(doc, dict):
            doc = doc.get(key)
        elif isinstance(doc, list) and isinstance(key, int) and key < len(doc):
            doc = doc[key]
        else:
            return None
    return doc


def _argvs(doc: dict) -> list[tuple[str, Any]]:
    found = [("command", doc.get("command")), ("checkpoint.resume", _get(doc, "checkpoint", "resume")),
             ("checkpoint.verify", _get(doc, "checkpoint", "verify")), ("version_command", doc.get("version_command")),
             ("launcher.mpiexec", _get(doc, "launcher", "mpiexec")),
             ("launcher.torchrun", _get(doc, "launcher", "torchrun"))]
    prepare = doc.get("prepare")
    if isinstance(prepare, list):
        found += [(f"prepare[{i}]", a) for i, a in enumerate(prepare)]
    post = _get(doc, "outputs", "post")
    if isinstance(post, list):
        found += [(f"outputs.post[{i}].command", _get(step, "command")) for i, step in enumerate(post)]
    return [(path, value) for path, value in found if value is not None]


def _image(image: Any, allowlist: tuple[str, ...]) -> list[Problem]:
    if not isinstance(image, str):
        return []
    out = []
    if not DIGEST.match(image):
        out.append(Problem("image-not-digest", "image", f"{image!r} is not pinned by digest: use "
                           "registry/repository@sha256:<64 hex digits> (a tag can move; a digest cannot)"))
    if not registry_allowed(image, allowlist):
        out.append(Problem("registry-not-allowed", "image", f"registry {registry_of(image)!r} is not on the "
                           f"allowlist {list(allowlist)} (UPWELL_REGISTRY_ALLOWLIST)"))
    return out


def _named(doc: dict, allowlist: tuple[str, ...]) -> list[Problem]:
    out = _image(doc.get("image"), allowlist)
    params = doc.get("params") if isinstance(doc.get("params"), dict) else {}
    for name, spec in params.items():
        if not isinstance(spec, dict) or "type" not in spec:
            out.append(Problem("param-without-type", f"params.{name}.type",
                               f"param {name!r} has no type; give one of int, float, str, bool, enum, path"))
    known = BUILTINS | set(params)
    for path, argv in _argvs(doc):
        if isinstance(argv, str):
            out.append(Problem("command-not-argv", path, "is a shell string; write an argv list, one element per "
                               f"argument (no shell runs), e.g. {argv.split()[:3]!r}"))
            continue
        for i, element in enumerate(argv if isinstance(argv, list) else []):
            out += _unknown(f"{path}[{i}]", element, known)
    files = doc.get("files") if isinstance(doc.get("files"), dict) else {}
    for name, text in files.items():
        out += _unknown(f"files.{name}", text, known)
    post = _get(doc, "outputs", "post")
    for i, step in enumerate(post if isinstance(post, list) else []):
        out += _unknown(f"outputs.post[{i}].stdin", _get(step, "stdin"), known)
    return out


def _unknown(path: str, text: Any, known: set[str]) -> list[Problem]:
    if not isinstance(text, str):
        return []
    return [Problem("unknown-placeholder", path, f"placeholder {{{name}}} is neither a param nor one of "
                    f"{sorted(BUILTINS)}" + (f"; if ${{{name}}} is the tool's own variable, write ${{{{{name}}}}}"
                                             if f"${{{name}}}" in text else ""))
            for name in placeholders(text) if name not in known]


TOOL_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")  # ${name}: a shell's, LAMMPS's, CMake's own syntax


def warnings(d: Definition) -> list[Problem]:
    """What is valid but likely a mistake: a param whose name also appears as ``${name}`` in a file or argv.
    upwell substitutes ``{name}`` inside it (``${T}`` becomes ``$300``), so a tool that meant its own variable
    ``T`` never sees it. ``${{name}}`` keeps the text for the tool (``{{``/``}}`` are literal braces)."""
    texts = {f"files.{k}": v for k, v in d.files.items()}
    texts.update({f"{where}[{i}]": a for where, argv in d.argvs().items() for i, a in enumerate(argv)})
    texts.update({f"outputs.post[{i}].stdin": p.stdin for i, p in enumerate(d.outputs.post)})
    out = []
    for where, text in texts.items():
        for name in dict.fromkeys(TOOL_VARIABLE.findall(text)):
            if name in d.params or name in BUILTINS:
                out.append(Problem("param-shadows-tool-variable", where,
                                   f"${{{name}}} is substituted with the param {name!r} (e.g. ${{{name}}} -> "
                                   f"$<value>); if the tool means its own variable, write ${{{{{name}}}}}"))
    return out


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _semantic(d: Definition) -> list[Problem]:
    """Cross-field checks the schema cannot express."""
    return _placeholders_used(d) + _paths_inside(d) + _defaults(d)


def _placeholders_used(d: Definition) -> list[Problem]:
    out = []
    for i, plot in enumerate(d.report.plots):
        if plot.x not in d.params:
            out.append(Problem("invalid", f"report.plots[{i}].x", f"{plot.x!r} is not a param"))
    used = {name for argv in d.argvs().values() for element in argv for name in placeholders(element)}
    used |= {name for text in [*d.files.values(), *(p.stdin for p in d.outputs.post)] for name in placeholders(text)}
    if d.input.required and not d.module and "input" not in used:
        out.append(Problem("invalid", "input.required", "an input is required but no argv uses {input}"))
    for name in sorted(used & set(d.params)):
        if d.params[name].default is None and not d.params[name].required:
            out.append(Problem("invalid", f"params.{name}", f"{{{name}}} is used in an argv or file, so the "
                               "param needs a default or required: true"))
    return out


def _paths_inside(d: Definition) -> list[Problem]:
    out = []
    for where, rel in d.relative_paths().items():
        parts = rel.replace("\\", "/").split("/")
        if not rel or rel.startswith(("/", "~")) or any(part in ("", ".", "..") for part in parts):
            out.append(Problem("invalid", where, f"{rel!r} must be a relative path inside the work dir"))
    return out


def _defaults(d: Definition) -> list[Problem]:
    out = []
    for name, p in d.params.items():
        if p.default is not None:
            err = check_value(name, p, p.default)
            if err:
                out.append(Problem("invalid", f"params.{name}.default", err))
    return out


def problems(doc: Any, allowlist: tuple[str, ...]) -> tuple[Definition | None, list[Problem]]:
    if not isinstance(doc, dict):
        return None, [Problem("invalid", "document", "a definition is a mapping at the top level")]
    named = _named(doc, allowlist)
    covered = {p.path for p in named}
    try:
        definition = Definition.model_validate(doc)
    except ValidationError as exc:
        rest = []
        for err in exc.errors():
            path = _loc(err["loc"]) or "document"
            if not any(path == c or path.startswith(c + ".") or path.startswith(c + "[") for c in covered):
                rest.append(Problem("invalid", path, err["msg"]))
        return None, named + rest
    found = named + _semantic(definition)
    return (definition if not found else None), found


def load(data: bytes, source: str, allowlist: tuple[str, ...], *, builtin: bool = False) -> Loaded:
    """Parse and check a definition file; raise DefinitionError listing every problem."""
    doc = parse_document(data, source if source.endswith((".yaml", ".yml", ".json")) else source + ".yaml")
    definition, found = problems(doc, allowlist)
    if found or definition is None:
        raise DefinitionError(source, found)
    return Loaded(definition, content_hash(data), source, builtin)
