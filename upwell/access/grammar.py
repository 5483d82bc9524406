"""The grammar of Azure role assignment conditions (version 2.0): a parser and an evaluator.

Followed: learn.microsoft.com "Azure role assignment condition format and syntax"
(role-based-access-control/conditions-format) and "Actions and attributes for Azure role assignment
conditions for Azure Blob Storage" (storage/blobs/storage-auth-abac-attributes):

    condition  := expr
    expr       := unary (('AND' | '&&' | 'OR' | '||') unary)*
                  -- three or more operands that mix AND and OR need parentheses ("Grouping and precedence")
    unary      := ('!' | 'NOT') unary | '(' expr ')' | 'ActionMatches' '{' str '}'
                | 'SubOperationMatches' '{' str '}' | 'Exists' attribute | operand operator operand
    operand    := attribute | str | number | 'true' | 'false' | '{' literal (',' literal)* '}'
    attribute  := '@' ('Resource' | 'Request' | 'Principal' | 'Environment') '[' name ']'
    operator   := String*, Numeric*, Bool*, DateTime*, Guid* functions, optionally prefixed by a cross
                  product quantifier ('ForAnyOfAnyValues:StringEquals' ...)

``parse`` refuses what the grammar does not allow, naming the position; ``evaluate`` answers whether a
request (an action, its suboperation and its attributes) passes, so tests can check what a condition
allows as well as that it parses. Strings are single-quoted and hold no quote.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Any

from upwell.errors import InputRejected

SOURCES = ("Resource", "Request", "Principal", "Environment")
_STRING_OPS = ("Equals", "NotEquals", "StartsWith", "NotStartsWith", "Like", "NotLike")
FUNCTIONS = frozenset(
    [f"String{op}{case}" for op in _STRING_OPS for case in ("", "IgnoreCase")]
    + [f"Numeric{op}" for op in ("Equals", "NotEquals", "LessThan", "LessThanEquals", "GreaterThan",
                                 "GreaterThanEquals")]
    + ["BoolEquals", "BoolNotEquals", "GuidEquals", "GuidNotEquals"]
    + [f"DateTime{op}" for op in ("Equals", "NotEquals", "GreaterThan", "GreaterThanEquals", "LessThan",
                                  "LessThanEquals")])
QUANTIFIERS = ("ForAnyOfAnyValues", "ForAllOfAnyValues", "ForAnyOfAllValues", "ForAllOfAllValues")

_TOKEN = re.compile(r"""\s*(?:
    (?P<attr>@(?P<src>[A-Za-z]+)\[(?P<name>[^\]]+)\])
  | (?P<str>'[^']*')
  | (?P<num>-?\d+(?:\.\d+)?)
  | (?P<op>&&|\|\||[!(){},])
  | (?P<word>[A-Za-z][A-Za-z0-9]*(?::[A-Za-z]+)?)
)""", re.X)


class ConditionSyntaxError(InputRejected):
    """A role assignment condition that the documented grammar does not allow; the message names where."""


@dataclass(frozen=True)
class Node:
    """One node of a parsed condition: ``kind`` is and, or, not, action, suboperation, exists or compare."""

    kind: str
    args: tuple = ()
    value: Any = None


def tokens(text: str) -> list[tuple[str, Any, int]]:
    """(kind, value, position) for every token; anything else is a ConditionSyntaxError."""
    out, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ConditionSyntaxError(f"unexpected {text[pos:pos + 20].strip()!r} at {pos}", field="condition")
        kind = m.lastgroup if m.lastgroup not in ("src", "name") else "attr"
        if m.group("attr"):
            if m.group("src") not in SOURCES:
                raise ConditionSyntaxError(f"unknown attribute source @{m.group('src')} at {m.start('attr')}; "
                                           f"known: {', '.join(SOURCES)}", field="condition")
            out.append(("attr", (m.group("src"), m.group("name")), m.start("attr")))
        elif m.group("str") is not None:
            out.append(("str", m.group("str")[1:-1], m.start("str")))
        elif m.group("num"):
            out.append(("num", float(m.group("num")), m.start("num")))
        else:
            out.append((kind, m.group(kind), m.start(kind)))
        pos = m.end()
    return out


class _Parser:
    """Recursive descent over ``tokens``; keeps the position of the next token."""

    def __init__(self, text: str):
        self.toks = tokens(text)
        self.i = 0

    def peek(self) -> tuple[str, Any, int] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, value: str | None = None, kind: str | None = None) -> tuple[str, Any, int]:
        tok = self.peek()
        if tok is None or (value is not None and tok[1] != value) or (kind is not None and tok[0] != kind):
            want = value or kind
            where = f"{tok[1]!r} at {tok[2]}" if tok else "the end"
            raise ConditionSyntaxError(f"expected {want} but found {where}", field="condition")
        self.i += 1
        return tok

    def expr(self) -> Node:
        operands, joins = [self.unary()], set()
        while (tok := self.peek()) and tok[0] in ("word", "op") and tok[1] in ("AND", "&&", "OR", "||"):
            self.i += 1
            joins.add("and" if tok[1] in ("AND", "&&") else "or")
            if len(joins) > 1:
                raise ConditionSyntaxError(f"AND and OR mixed without parentheses at {tok[2]}", field="condition")
            operands.append(self.unary())
        return operands[0] if len(operands) == 1 else Node(joins.pop(), tuple(operands))

    def unary(self) -> Node:
        tok = self.peek()
        if tok is None:
            raise ConditionSyntaxError("the condition ends where an expression should be", field="condition")
        if tok[1] in ("!", "NOT"):
            self.i += 1
            return Node("not", (self.unary(),))
        if tok[1] == "(":
            self.i += 1
            inner = self.expr()
            self.take(")")
            return inner
        if tok[1] in ("ActionMatches", "SubOperationMatches"):
            self.i += 1
            self.take("{")
            pattern = self.take(kind="str")[1]
            self.take("}")
            return Node("action" if tok[1] == "ActionMatches" else "suboperation", value=pattern)
        if tok[1] == "Exists":
            self.i += 1
            return Node("exists", value=self.take(kind="attr")[1])
        return self.comparison()

    def comparison(self) -> Node:
        left = self.operand()
        tok = self.take(kind="word")
        quantifier, _, function = tok[1].rpartition(":")
        if function not in FUNCTIONS or (quantifier and quantifier not in QUANTIFIERS):
            raise ConditionSyntaxError(f"unknown operator {tok[1]!r} at {tok[2]}", field="condition")
        return Node("compare", (left, self.operand()), value=(quantifier, function))

    def operand(self) -> Any:
        tok = self.take()
        if tok[0] in ("attr", "str", "num"):
            return tok[1] if tok[0] != "attr" else ("@", *tok[1])
        if tok[1] in ("true", "false"):
            return tok[1] == "true"
        if tok[1] == "{":
            values = [self.take()[1]]
            while self.peek() and self.peek()[1] == ",":
                self.i += 1
                values.append(self.take()[1])
            self.take("}")
            return tuple(values)
        raise ConditionSyntaxError(f"expected an attribute or a value but found {tok[1]!r} at {tok[2]}",
                                   field="condition")


def parse(text: str) -> Node:
    """The condition's tree; ConditionSyntaxError when the grammar does not allow it."""
    if not text or not text.strip():
        raise ConditionSyntaxError("the condition is empty", field="condition")
    parser = _Parser(text)
    node = parser.expr()
    if parser.peek() is not None:
        tok = parser.peek()
        raise ConditionSyntaxError(f"unexpected {tok[1]!r} at {tok[2]} after a complete condition", field="condition")
    return node


@dataclass(frozen=True)
class Request:
    """What a condition is evaluated against: the data action, its suboperation, and the attributes by
    (source, name), e.g. ("Resource", "Microsoft.Storage/storageAccounts/blobServices/containers:name")."""

    action: str
    suboperation: str = ""
    attributes: dict | None = None


def evaluate(node: Node, request: Request) -> bool:
    """Whether ``request`` passes the condition ``node`` (a missing attribute compares as absent: false)."""
    if node.kind == "and":
        return all(evaluate(n, request) for n in node.args)
    if node.kind == "or":
        return any(evaluate(n, request) for n in node.args)
    if node.kind == "not":
        return not evaluate(node.args[0], request)
    if node.kind == "action":
        return fnmatch.fnmatchcase(request.action.lower(), node.value.lower())
    if node.kind == "suboperation":
        return request.suboperation.lower() == node.value.lower()
    if node.kind == "exists":
        return node.value in (request.attributes or {})
    return _compare(node, request)


def _value(operand: Any, request: Request) -> tuple | None:
    if isinstance(operand, tuple) and operand[:1] == ("@",):
        got = (request.attributes or {}).get(operand[1:])
        return None if got is None else (tuple(got) if isinstance(got, list | tuple | set) else (got,))
    return operand if isinstance(operand, tuple) else (operand,)


def _compare(node: Node, request: Request) -> bool:
    quantifier, function = node.value
    left, right = (_value(o, request) for o in node.args)
    if left is None or right is None:
        return False
    negated = "Not" in function
    base = function.replace("Not", "")
    test = _TESTS.get(base.replace("IgnoreCase", "").removeprefix("String"), lambda a, b: a == b)
    fold = (lambda s: str(s).lower()) if base.endswith("IgnoreCase") else (lambda s: s)

    def one(a, b) -> bool:  # a negated function is negated pair by pair, as the cross products define it
        return test(fold(a), fold(b)) != negated

    outer = all if quantifier.startswith("ForAll") else any
    inner = all if quantifier.endswith("AllValues") else any
    return outer(inner(one(a, b) for b in right) for a in left)


_TESTS = {"Equals": lambda a, b: a == b, "StartsWith": lambda a, b: str(a).startswith(str(b)),
          "Like": lambda a, b: fnmatch.fnmatchcase(str(a), str(b)), "NumericLessThan": lambda a, b: a < b,
          "NumericGreaterThan": lambda a, b: a > b, "NumericLessThanEquals": lambda a, b: a <= b,
          "NumericGreaterThanEquals": lambda a, b: a >= b}
