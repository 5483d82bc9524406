"""Check the resources in bicep/ against Azure's published resource types.

The type data is what the Bicep compiler itself uses: the generated type
definitions of the Azure/bicep-types-az repository. tests/data/bicep_types/
keeps, per namespace and API version, the sections of that repository's
generated ``types.md`` that the templates reach (descriptions and string
patterns dropped), with the source path and commit in each file's first line.

For every resource (``existing`` ones included) this checks, recursively as
deep as the kept sections go:

* the resource type and API version have type data at all;
* every property set is a property of its object type (or the type allows
  additional properties), and none is read-only;
* required properties of literal objects are present;
* literal strings of a closed enum, and literal booleans and integers, match
  the property's type;
* discriminated objects (``endpointType``, ...) use the variant's properties.

Values are followed through variables, parameter defaults, conditionals,
``concat``/``union`` and ``for`` expressions. pycep (bicep/tools/bicep_json.py)
does not keep Bicep's quotes, so a bare string that names a parameter,
variable, resource, module or loop item of the same file counts as a reference,
not a literal.

    .venv-iac/bin/python bicep/tools/bicep_types.py        # parse bicep/ and check it; exit 1 on findings

The checking functions take the pycep trees as plain JSON, so tests run them
from the main venv on the trees produced by bicep_json.py in .venv-iac.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = ROOT / "tests" / "data" / "bicep_types"

# Keys a Bicep resource body may have besides the type's own properties.
BICEP_RESOURCE_KEYS = {"parent", "scope", "dependsOn"}
FLAG_WORDS = {"Required", "ReadOnly", "WriteOnly", "DeployTimeConstant", "Identifier"}
SOURCE_RE = re.compile(r"<!-- source: (\S+) (\S+) @ ([0-9a-f]{40}) -->")
PROP_RE = re.compile(r"^\* \*\*(?P<name>[^*]+)\*\*: (?P<rest>.*)$")
LINK_RE = re.compile(r"^\[(?P<name>[^\]]+)\]\(#[^)]*\)(?P<array>(\[\])*)$")
FLAGS_RE = re.compile(r"\s\(([A-Za-z, ]+)\)$")
CONSTRAINT_RE = re.compile(r"\s*\{[^{}]*\}")
LITERAL_RE = re.compile(r"^'([^']*)'$")


# ---------------------------------------------------------------- type data


@dataclass
class TypeRef:
    """A property's type: a named object section, a primitive, or a string union."""

    kind: str  # "object" | "primitive" | "union" | "any"
    name: str = ""  # object section name, or primitive name
    literals: tuple[str, ...] = ()
    open_union: bool = False  # the union also admits any string
    array_depth: int = 0


@dataclass
class Prop:
    name: str
    type: TypeRef
    flags: frozenset[str]


@dataclass
class ObjectType:
    name: str
    properties: dict[str, Prop] = field(default_factory=dict)
    additional: TypeRef | None = None  # type of additional properties, if allowed
    discriminator: str | None = None
    variants: dict[str, dict[str, Prop]] = field(default_factory=dict)  # discriminator value -> props


@dataclass
class TypeFile:
    path: Path
    namespace: str
    version: str
    source_repo: str
    source_path: str
    commit: str
    resources: dict[str, ObjectType]  # "Microsoft.X/y" -> body
    types: dict[str, ObjectType]


def parse_type(text: str) -> TypeRef:
    text = CONSTRAINT_RE.sub("", text).strip()
    depth = 0
    while text.endswith("[]"):
        text = text[:-2].strip()
        depth += 1
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1].strip()
    m = LINK_RE.match(text)
    if m:
        return TypeRef("object", m.group("name"), array_depth=depth + len(m.group("array")) // 2)
    if "|" in text or LITERAL_RE.match(text):
        parts = [p.strip() for p in text.split("|")]
        literals = tuple(LITERAL_RE.match(p).group(1) for p in parts if LITERAL_RE.match(p))
        return TypeRef("union", literals=literals, open_union=any(not LITERAL_RE.match(p) for p in parts),
                       array_depth=depth)
    if text in ("string", "int", "bool", "object"):
        return TypeRef("primitive", text, array_depth=depth)
    return TypeRef("any", text, array_depth=depth)


def parse_prop(line: str) -> Prop | None:
    m = PROP_RE.match(line.strip())
    if not m:
        return None
    rest = m.group("rest")
    flags: frozenset[str] = frozenset()
    fm = FLAGS_RE.search(rest)
    if fm and set(w.strip() for w in fm.group(1).split(",")) <= FLAG_WORDS:
        flags = frozenset(w.strip() for w in fm.group(1).split(","))
        rest = rest[: fm.start()]
    return Prop(m.group("name"), parse_type(rest), flags)


def parse_type_file(path: Path) -> TypeFile:
    lines = path.read_text().splitlines()
    src = SOURCE_RE.match(lines[0]) if lines else None
    if not src:
        raise ValueError(f"{path}: the first line must be '<!-- source: <repo> <path> @ <commit> -->'")
    head = next(ln for ln in lines if ln.startswith("# "))
    namespace, version = (s.strip() for s in head[2:].split("(")[0].split("@"))
    resources: dict[str, ObjectType] = {}
    types: dict[str, ObjectType] = {}
    current: ObjectType | None = None
    target: dict[str, Prop] | None = None
    mode = ""
    for raw in lines[1:]:
        line = raw.rstrip()
        if line.startswith("## "):
            title = line[3:].strip()
            mode = "props"
            if title.startswith("Resource "):
                full = title[len("Resource "):]
                rtype, _, rversion = full.partition("@")
                if rversion != version:
                    raise ValueError(f"{path}: {full} is not at {version}")
                current = ObjectType(full)
                resources[rtype] = current
            elif title.startswith("Function "):
                current, mode = None, ""
                continue
            else:
                current = types.setdefault(title, ObjectType(title))
            target = current.properties
        elif current is None:
            continue
        elif line.startswith("* **Discriminator**:"):
            current.discriminator = line.split(":", 1)[1].strip()
        elif line == "### Base Properties":
            target = current.properties
        elif line == "### Additional Properties":
            mode = "additional"
        elif line.startswith("### ") and line != "### Properties" and current.discriminator:
            mode = "variant"
            target = {}
            # keyed by position until the discriminator literal is known (variant names may repeat)
            current.variants[str(len(current.variants))] = target
        elif line == "### Properties" or line == "#### Properties":
            mode = "props" if mode != "variant" else "variant"
        elif line.startswith("* **"):
            if mode == "additional":
                current.additional = parse_type(line.split(":", 1)[1])
                continue
            prop = parse_prop(line)
            if prop is not None and target is not None:
                target.setdefault(prop.name, prop)
    # Key each variant by its discriminator literal.
    for obj in [*types.values(), *resources.values()]:
        if obj.discriminator:
            keyed = {}
            for props in obj.variants.values():
                d = props.get(obj.discriminator)
                if d is None or not d.type.literals:
                    raise ValueError(f"{path}: {obj.name}: a variant has no literal {obj.discriminator}")
                keyed[d.type.literals[0]] = props
            obj.variants = keyed
    return TypeFile(path, namespace, version, src.group(1), src.group(2), src.group(3), resources, types)


def load_type_data(data_dir: Path = DATA_DIR) -> dict[tuple[str, str], TypeFile]:
    """{(namespace lower-cased, api version): TypeFile} for every kept file."""
    out = {}
    for path in sorted(data_dir.glob("*.md")):
        if path.name == "README.md":
            continue
        tf = parse_type_file(path)
        key = (tf.namespace.lower(), tf.version)
        if key in out:
            # Two sources for one namespace and version (Private DNS lives in Microsoft.Network too).
            out[key].resources.update(tf.resources)
            for name, obj in tf.types.items():
                out[key].types.setdefault(name, obj)
        else:
            out[key] = tf
    return out


def lookup(data: dict[tuple[str, str], TypeFile], rtype: str, version: str) -> tuple[TypeFile, ObjectType] | None:
    tf = data.get((rtype.split("/")[0].lower(), version))
    if tf is None:
        return None
    for name, body in tf.resources.items():
        if name.lower() == rtype.lower():
            return tf, body
    return None


# ---------------------------------------------------------------- checking


@dataclass
class Finding:
    file: str
    resource: str
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.resource}: {self.path}: {self.message}"


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=dict)  # "file:resource" -> property names and values checked
    resources: list[tuple[str, str, str, str]] = field(default_factory=list)  # (file, symbol, type, version)
    existing: set[str] = field(default_factory=set)  # "file:symbol" of `existing` references


def _is_expr(value: object) -> bool:
    if not isinstance(value, dict) or len(value) != 1:
        return False
    key, inner = next(iter(value.items()))
    return key in ("operator", "function") and isinstance(inner, dict) and "type" in inner


def _is_loop(value: object) -> bool:
    return isinstance(value, dict) and "loop_type" in value and "config" in value


def _clean_key(key: str) -> str | None:
    """The property name of an object key, or None for a computed key."""
    if key.startswith("'") and key.endswith("'"):
        key = key[1:-1]
    return None if "${" in key else key


class _Checker:
    def __init__(self, file: str, tree: dict, tf: TypeFile, report: Report, symbol: str):
        self.file, self.tf, self.report, self.symbol = file, tf, report, symbol
        self.variables = {k: v.get("value") for k, v in (tree.get("variables") or {}).items()}
        self.param_defaults = {k: v.get("default") for k, v in (tree.get("parameters") or {}).items()}
        self.identifiers = set(self.variables) | set(self.param_defaults) | set(tree.get("resources") or {}) \
            | set(tree.get("modules") or {}) | _loop_items(tree)
        self.key = f"{file}:{symbol}"
        report.checked.setdefault(self.key, 0)

    def find(self, path: str, message: str) -> None:
        self.report.findings.append(Finding(self.file, self.symbol, path, message))

    def resolve(self, value: object, seen: frozenset[str] = frozenset()) -> list[object]:
        """The literal shapes a value may take (several for conditionals); opaque values as None."""
        if isinstance(value, str) and value in self.identifiers:
            if value in seen:
                return [None]
            if value in self.variables:
                return self.resolve(self.variables[value], seen | {value})
            default = self.param_defaults.get(value)
            if isinstance(default, (dict, list)) and not _is_expr(default):
                return self.resolve(default, seen | {value})
            return [None]
        if _is_expr(value):
            kind, inner = next(iter(value.items()))
            if kind == "operator" and inner["type"] == "conditional":
                ops = inner["operands"]
                return self.resolve(ops["true_value"], seen) + self.resolve(ops["false_value"], seen)
            if kind == "function" and inner["type"] in ("concat", "union"):
                out: list[object] = []
                for arg in (inner.get("parameters") or {}).values():
                    out.extend(self.resolve(arg, seen))
                return [("__parts__", inner["type"], out)]
            return [None]
        return [value]

    def check_value(self, value: object, tref: TypeRef, path: str, depth: int | None = None) -> None:
        depth = tref.array_depth if depth is None else depth
        for shape in self.resolve(value):
            if shape is None:
                continue
            if isinstance(shape, tuple) and shape[0] == "__parts__":
                _, fn, parts = shape
                for part in parts:
                    if part is None:
                        continue
                    if fn == "concat" and depth > 0 and not isinstance(part, list):
                        # concat's arguments are arrays, or opaque; a single object part is one element
                        self.check_value(part, tref, path + "[]", depth - 1)
                    else:
                        self.check_value(part, tref, path, depth)
                continue
            if depth > 0:
                if _is_loop(shape):
                    self.check_value(shape["config"], tref, path + "[]", depth - 1)
                elif isinstance(shape, list):
                    for i, item in enumerate(shape):
                        self.check_value(item, tref, f"{path}[{i}]", depth - 1)
                else:
                    self.find(path, f"expected an array, got {type(shape).__name__}")
                continue
            self.check_scalar_or_object(shape, tref, path)

    def check_scalar_or_object(self, value: object, tref: TypeRef, path: str) -> None:
        self.report.checked[self.key] += 1
        if tref.kind == "object":
            obj = self.tf.types.get(tref.name)
            if obj is None:
                return  # the kept data stops here
            if not isinstance(value, dict):
                self.find(path, f"expected an object ({tref.name}), got {type(value).__name__}")
                return
            self.check_object(value, obj, path)
        elif tref.kind == "union":
            if isinstance(value, str) and "${" not in value and value not in self.identifiers \
                    and not tref.open_union and value.lower() not in (lit.lower() for lit in tref.literals):
                self.find(path, f"'{value}' is not one of {list(tref.literals)}")
            elif isinstance(value, (dict, list)):
                self.find(path, "expected a string")
        elif tref.kind == "primitive":
            if tref.name == "bool" and not (isinstance(value, bool) or _opaque_str(value, self.identifiers)):
                self.find(path, f"expected a bool, got {value!r}")
            elif tref.name == "int" and (isinstance(value, bool) or not (isinstance(value, int)
                                                                          or _opaque_str(value, self.identifiers))):
                self.find(path, f"expected an int, got {value!r}")
            elif tref.name == "string" and isinstance(value, (bool, dict, list)):
                self.find(path, f"expected a string, got {value!r}")

    def check_object(self, value: dict, obj: ObjectType, path: str, extra_keys: frozenset[str] = frozenset(),
                     literal: bool = True) -> None:
        props = dict(obj.properties)
        if obj.discriminator:
            disc = value.get(obj.discriminator)
            if isinstance(disc, str) and disc in obj.variants:
                props.update(obj.variants[disc])
            elif isinstance(disc, str) and disc not in self.identifiers:
                self.find(f"{path}.{obj.discriminator}",
                          f"'{disc}' is not one of {sorted(obj.variants)} ({obj.name})")
                return
            else:
                for variant in obj.variants.values():
                    props.update(variant)
        lower = {k.lower(): p for k, p in props.items()}
        for raw_key, sub in value.items():
            key = _clean_key(raw_key)
            if key is None or key in extra_keys:
                continue
            self.report.checked[self.key] += 1
            prop = props.get(key)
            where = f"{path}.{key}" if path else key
            if prop is None and key.lower() in lower:
                self.find(where, f"'{key}' differs only in case from '{lower[key.lower()].name}' ({obj.name})")
                continue
            if prop is None:
                if obj.additional is not None:
                    self.check_value(sub, obj.additional, where)
                    continue
                self.find(where, f"'{key}' is not a property of {obj.name} in {self.tf.namespace}@{self.tf.version}")
                continue
            if "ReadOnly" in prop.flags and "Required" not in prop.flags:
                self.find(where, f"'{key}' is read-only in {obj.name}")
                continue
            self.check_value(sub, prop.type, where)
        if literal:
            present = {k.lower() for k in (_clean_key(r) or "" for r in value)}
            for name, prop in props.items():
                if "Required" in prop.flags and "ReadOnly" not in prop.flags and name.lower() not in present:
                    self.find(f"{path}.{name}" if path else name,
                              f"required property '{name}' of {obj.name} is missing")


def _opaque_str(value: object, identifiers: set[str]) -> bool:
    return isinstance(value, str) and (value in identifiers or "${" in value or "." in value)


def _loop_items(tree: dict) -> set[str]:
    names: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if _is_loop(node):
                detail = node["loop_type"].get("detail") or {}
                for k in ("item_name", "index_name"):
                    if detail.get(k):
                        names.add(detail[k])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(tree)
    return names


def _bodies(config: object) -> list[dict]:
    """The resource body of a plain, conditional or loop resource declaration."""
    if isinstance(config, dict) and "config" in config and ("condition" in config or "loop_type" in config):
        return _bodies(config["config"])
    return [config] if isinstance(config, dict) else []


def check_trees(trees: dict[str, dict], data: dict[tuple[str, str], TypeFile] | None = None) -> Report:
    """Check every resource of every pycep tree ({file: tree}) against the type data."""
    data = load_type_data() if data is None else data
    report = Report()
    for file, tree in sorted(trees.items()):
        for symbol, res in (tree.get("resources") or {}).items():
            rtype, version = res["type"], res["api_version"]
            report.resources.append((file, symbol, rtype, version))
            if res.get("existing"):
                report.existing.add(f"{file}:{symbol}")
            found = lookup(data, rtype, version)
            if found is None:
                report.findings.append(Finding(file, symbol, "", f"no type data for {rtype}@{version} "
                                               f"(tests/data/bicep_types/; a version the Bicep types do not know?)"))
                continue
            tf, body = found
            checker = _Checker(file, tree, tf, report, symbol)
            for b in _bodies(res["config"]):
                checker.check_object(b, body, "", extra_keys=frozenset(BICEP_RESOURCE_KEYS),
                                     literal=not res.get("existing"))
    return report


def main(argv: list[str]) -> int:
    import json
    import subprocess

    paths = [Path(a) for a in argv] or sorted((ROOT / "bicep").rglob("*.bicep"))
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("bicep_json.py")), *map(str, paths)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
        return 1
    trees = {}
    for key, tree in json.loads(proc.stdout).items():
        path = Path(key).resolve()
        trees[str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)] = tree
    report = check_trees(trees)
    for f in report.findings:
        print(f, file=sys.stderr)
    print(f"bicep types: {len(report.resources)} resources, {sum(report.checked.values())} properties checked, "
          f"{len(report.findings)} findings", file=sys.stderr)
    return 1 if report.findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
