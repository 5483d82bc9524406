"""Validate a manifest's params (and each grid point) against a definition, before dispatch.

Unknown names are refused, defaults are filled in, and every error names the
field (``params.temperature``). Built-in Python payloads are also checked by their
pydantic models in ``upwell.payloads.models`` (cross-field rules such as Welch's overlap).
"""

from __future__ import annotations

import math
import re
import unicodedata
from typing import Any

from pydantic import ValidationError

from upwell.errors import InputRejected
from upwell.payloads import models as P
from upwell.payloads.definition import Definition, Param

MAX_STR = 1 << 16  # the manifest limit max_param_bytes (16 KiB) is usually met first
BUILTIN_MODELS: dict[str, type[P.Params]] = {
    "workers.payloads.logistic": P.LogisticParams,
    "workers.payloads.channel_stats": P.ChannelStatsParams,
    "workers.payloads.welch": P.WelchParams,
    "workers.payloads.heat": P.HeatParams,
    "workers.payloads.train": P.TrainParams,
}


def _number(name: str, p: Param, value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{name} must be {'an integer' if p.type == 'int' else 'a number'}, not {type(value).__name__}"
    if p.type == "int" and not isinstance(value, int):
        return f"{name} must be an integer, not {value!r}"
    if not math.isfinite(value):
        return f"{name} must be finite"
    if p.min is not None and value < p.min:
        return f"{name} = {value} is below the minimum {p.min:g}"
    if p.max is not None and value > p.max:
        return f"{name} = {value} is above the maximum {p.max:g}"
    return None


def _text(name: str, p: Param, value: Any) -> str | None:
    if not isinstance(value, str):
        return f"{name} must be text, not {type(value).__name__}"
    if len(value) > MAX_STR or any(unicodedata.category(c) == "Cc" for c in value):
        return f"{name} must be at most {MAX_STR} characters with no control characters"
    if p.type == "path":
        parts = value.replace("\\", "/").split("/")
        if not value or value.startswith(("/", "~")) or re.match(r"^[A-Za-z]:", value) \
                or any(part in ("", ".", "..") for part in parts):
            return f"{name} = {value!r} must be a relative path inside the work dir (no '..', not absolute)"
    if p.pattern is not None and not re.fullmatch(p.pattern, value):
        return f"{name} = {value!r} does not match the pattern {p.pattern!r}"
    return None


def did_you_mean(wrong: str, known: list[str]) -> str:
    """'; did you mean steps?' for a misspelt name close to a known one, else '; known: ...'."""
    import difflib

    close = [k for k in known if k.startswith(wrong) or wrong.startswith(k)] or \
        difflib.get_close_matches(wrong, known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else f"; known: {', '.join(sorted(known))}"


def check_value(name: str, p: Param, value: Any) -> str | None:
    """An error message for one value, or None when it is valid."""
    if p.type in ("int", "float"):
        return _number(name, p, value)
    if p.type in ("str", "path"):
        return _text(name, p, value)
    if p.type == "bool":
        return None if isinstance(value, bool) else f"{name} must be true or false, not {value!r}"
    return None if value in (p.choices or []) and not isinstance(value, bool) \
        else f"{name} = {value!r} is not one of {p.choices}"


def validate(definition: Definition, params: dict[str, Any], *, where: str = "params") -> dict[str, Any]:
    """The full parameter set (defaults filled in); InputRejected names the first bad field."""
    if definition.module in BUILTIN_MODELS:  # the built-in's own model first: its messages, its cross-field rules
        _builtin_model(definition, params, where)
    unknown = sorted(set(params) - set(definition.params))
    if unknown:
        raise InputRejected(f"{where}.{unknown[0]}: {definition.name} has no param {unknown[0]!r}"
                            f"{did_you_mean(unknown[0], list(definition.params))}", field=f"{where}.{unknown[0]}")
    out: dict[str, Any] = {}
    for name, p in definition.params.items():
        if name not in params:
            if p.required:
                raise InputRejected(f"{where}.{name}: {definition.name} needs a value for {name!r}",
                                    field=f"{where}.{name}")
            if p.default is not None:
                out[name] = p.default
            continue
        error = check_value(name, p, params[name])
        if error:
            raise InputRejected(f"{where}.{name}: {error}", field=f"{where}.{name}")
        out[name] = float(params[name]) if p.type == "float" else params[name]
    return _builtin_model(definition, out, where)


def _builtin_model(definition: Definition, values: dict[str, Any], where: str) -> dict[str, Any]:
    model = BUILTIN_MODELS.get(definition.module)
    if model is None:
        return values
    try:
        model.model_validate(values)
    except ValidationError as exc:
        err = exc.errors()[0]
        name = ".".join(str(p) for p in err.get("loc", ())) or "params"
        hint = did_you_mean(str(err["loc"][-1]), list(model.model_fields)) \
            if err.get("type") == "extra_forbidden" and err.get("loc") else ""
        raise InputRejected(f"{where}.{name}: {err['msg']}{hint}", field=f"{where}.{name}") from None
    return values
