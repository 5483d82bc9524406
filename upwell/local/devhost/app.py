"""Load a Python v2 Functions app once and describe each function's bindings.

``FunctionApp.get_functions()`` may run only once per app (a second call fails
its unique-name check), so ``load_functions`` caches the result per app object.
Bindings are read from ``get_raw_bindings()``, the same JSON the Python worker
sends to the host, so enums arrive as the strings the host sees.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
import threading
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from upwell.errors import ConfigError

TRIGGERS = ("blobTrigger", "queueTrigger", "timerTrigger", "httpTrigger", "eventGridTrigger")
# (type, direction) pairs the devhost can serve besides the trigger.
BINDINGS = {("queue", "OUT"), ("blob", "OUT"), ("blob", "IN"), ("http", "OUT")}
RETURN = "$return"

_cache: dict[int, tuple[Any, list[FunctionSpec]]] = {}
_lock = threading.Lock()


@dataclass(frozen=True)
class FunctionSpec:
    """One function: its name, trigger binding, other bindings, and the Python callable."""

    name: str
    trigger: dict
    inputs: tuple[dict, ...]
    outputs: tuple[dict, ...]
    func: Callable[..., Any]
    annotations: dict[str, Any]
    context_param: str | None

    @property
    def trigger_type(self) -> str:
        return self.trigger["type"]

    @property
    def function_id(self) -> str:
        """The id the Functions host gives the function (used in receipts and poison messages)."""
        return f"Host.Functions.{self.name}"

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.func)


def import_app(ref: str, script_root: Path | None = None) -> Any:
    """Import ``module:attr`` (default attribute ``app``), with ``script_root`` on sys.path."""
    module_name, _, attr = ref.partition(":")
    root = str((script_root or Path.cwd()).resolve())
    if root not in sys.path:
        sys.path.insert(0, root)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        raise ConfigError(f"--app {ref!r}: no module {module_name!r} under {root}") from None
    try:
        return getattr(module, attr or "app")
    except AttributeError:
        raise ConfigError(f"--app {ref!r}: module {module_name!r} has no attribute {attr or 'app'!r}") from None


def load_functions(app: Any, script_root: Path | None = None) -> list[FunctionSpec]:
    """The functions of ``app`` (a FunctionApp or a ``module:attr`` string), computed once per app."""
    if isinstance(app, str):
        app = import_app(app, script_root)
    with _lock:
        cached = _cache.get(id(app))
        if cached is None:
            cached = (app, [_describe(fn) for fn in app.get_functions()])
            _cache[id(app)] = cached  # keeps `app` alive, so its id is not reused
        return list(cached[1])


def _annotations(func: Callable) -> dict[str, Any]:
    try:
        return typing.get_type_hints(func)
    except Exception:  # noqa: BLE001 - resolving hints runs user code; any failure: use the raw ones
        return dict(getattr(func, "__annotations__", {}))


def _describe(fn: Any) -> FunctionSpec:
    name = fn.get_function_name()
    bindings = [json.loads(raw) for raw in fn.get_raw_bindings()]
    triggers = [b for b in bindings if b["type"].endswith("Trigger")]
    if len(triggers) != 1 or triggers[0]["type"] not in TRIGGERS:
        kinds = [b["type"] for b in triggers]
        raise ConfigError(f"function {name}: trigger {kinds} is not one the devhost drives ({', '.join(TRIGGERS)})")
    others = [b for b in bindings if b is not triggers[0]]
    for b in others:
        if (b["type"], b["direction"]) not in BINDINGS:
            raise ConfigError(f"function {name}: binding {b['name']!r} of type {b['type']!r} "
                              f"({b['direction']}) is not supported by the devhost")
    func = fn.get_user_function()
    return FunctionSpec(
        name=name, trigger=triggers[0],
        inputs=tuple(b for b in others if b["direction"] == "IN"),
        outputs=tuple(b for b in others if b["direction"] == "OUT"),
        func=func, annotations=_annotations(func),
        context_param=_check_params(name, func, bindings),
    )


def _check_params(name: str, func: Callable, bindings: list[dict]) -> str | None:
    """Every binding names a parameter and every parameter is bound; returns the context parameter."""
    params = inspect.signature(func).parameters
    bound = {b["name"] for b in bindings if b["name"] != RETURN}
    missing = bound - params.keys()
    if missing:
        raise ConfigError(f"function {name}: bindings {sorted(missing)} name no parameter of {func.__qualname__}")
    context = None
    for param in params.values():
        if param.name in bound or param.default is not inspect.Parameter.empty:
            continue
        if param.name == "context":
            context = param.name
            continue
        raise ConfigError(f"function {name}: parameter {param.name!r} has no binding")
    return context
