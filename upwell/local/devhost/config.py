"""What the devhost reads before it starts: host.json, app settings, connections.

``HostConfig`` is the frozen, typed view of the host.json keys that the devhost
honours; ``AppSettings`` resolves ``%NAME%`` references and connection names the way
the Functions host does (explicit overrides, then the process environment).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from upwell.errors import ConfigError

_TIMESPAN = re.compile(r"^(?:(?P<d>\d+)\.)?(?P<h>\d{1,2}):(?P<m>\d{1,2}):(?P<s>\d{1,2}(?:\.\d+)?)$")
_PERCENT = re.compile(r"%([^%\s]+)%")
DEFAULT_CONNECTION = "AzureWebJobsStorage"


def parse_timespan(text: str | int | float, name: str) -> float:
    """Seconds in a .NET TimeSpan ``[d.]hh:mm:ss[.fff]``; a bare number is seconds. Error names ``name``."""
    if isinstance(text, int | float):
        return float(text)
    match = _TIMESPAN.match(str(text).strip())
    if not match:
        raise ConfigError(f"host.json {name}: {text!r} is not a TimeSpan like '00:00:05' or '1.00:00:00'")
    days = int(match["d"] or 0)
    return days * 86400 + int(match["h"]) * 3600 + int(match["m"]) * 60 + float(match["s"])


@dataclass(frozen=True)
class QueueSettings:
    """host.json ``extensions.queues``, with the Functions host's defaults."""

    batch_size: int = 16
    new_batch_threshold: int = 8
    visibility_timeout: float = 0.0  # delay before a failed message is visible again
    max_polling_interval: float = 60.0
    max_dequeue_count: int = 5
    message_encoding: str = "base64"  # "base64" or "none", as in the Storage extension 5.x

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> QueueSettings:
        batch = int(raw.get("batchSize", 16))
        if not 1 <= batch <= 32:
            raise ConfigError(f"host.json extensions.queues.batchSize: {batch} must be within 1-32")
        encoding = str(raw.get("messageEncoding", "base64")).lower()
        if encoding not in ("base64", "none"):
            raise ConfigError(f"host.json extensions.queues.messageEncoding: {encoding!r} must be base64 or none")
        return cls(
            batch_size=batch,
            new_batch_threshold=int(raw.get("newBatchThreshold", batch // 2)),
            visibility_timeout=parse_timespan(raw.get("visibilityTimeout", 0), "extensions.queues.visibilityTimeout"),
            max_polling_interval=parse_timespan(raw.get("maxPollingInterval", "00:01:00"),
                                                "extensions.queues.maxPollingInterval"),
            max_dequeue_count=int(raw.get("maxDequeueCount", 5)),
            message_encoding=encoding,
        )


@dataclass(frozen=True)
class HostConfig:
    """The parts of host.json that the devhost honours; ``raw`` keeps the whole file."""

    function_timeout: float | None = 1800.0  # None: unbounded ("-1")
    queues: QueueSettings = field(default_factory=QueueSettings)
    blob_parallelism: int = 8
    poison_blob_threshold: int = 5  # extensions.blobs.poisonBlobThreshold
    route_prefix: str = "api"
    raw: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> HostConfig:
        version = raw.get("version", "2.0")
        if version != "2.0":
            raise ConfigError(f"host.json version: {version!r}; the Functions runtime 4.x needs \"2.0\"")
        timeout = raw.get("functionTimeout", "00:30:00")
        extensions = raw.get("extensions", {})
        return cls(
            function_timeout=None if str(timeout) == "-1" else parse_timespan(timeout, "functionTimeout"),
            queues=QueueSettings.from_json(extensions.get("queues", {})),
            blob_parallelism=int(extensions.get("blobs", {}).get("maxDegreeOfParallelism", 8)),
            poison_blob_threshold=int(extensions.get("blobs", {}).get("poisonBlobThreshold", 5)),
            route_prefix=str(extensions.get("http", {}).get("routePrefix", "api")).strip("/"),
            raw=raw,
        )

    @classmethod
    def load(cls, source: Path | str | Mapping[str, Any] | None) -> HostConfig:
        """From a path, a dict, or None (the defaults)."""
        if source is None:
            return cls()
        if isinstance(source, Mapping):
            return cls.from_json(source)
        path = Path(source)
        try:
            return cls.from_json(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"host.json at {path}: {exc}") from None


def load_local_settings(path: Path, environ: dict[str, str] | None = None) -> dict[str, str]:
    """Put ``Values`` of local.settings.json into the environment, as ``func start`` does.

    A variable already set in the environment wins, so a shell or CI can override
    the file. Returns the values read; a missing file reads as empty.
    """
    environ = os.environ if environ is None else environ
    if not path.exists():
        return {}
    try:
        values = json.loads(path.read_text()).get("Values", {})
    except (OSError, json.JSONDecodeError, AttributeError) as exc:
        raise ConfigError(f"local.settings.json at {path}: {exc}") from None
    values = {str(k): str(v) for k, v in values.items()}
    for key, value in values.items():
        environ.setdefault(key, value)
    return values


class AppSettings:
    """App settings: explicit overrides first, then the environment (read at each lookup)."""

    def __init__(self, overrides: Mapping[str, str] | None = None) -> None:
        self.overrides = dict(overrides or {})

    def get(self, name: str) -> str | None:
        if name in self.overrides:
            return self.overrides[name]
        return os.environ.get(name)

    def resolve(self, text: str, where: str) -> str:
        """Replace each ``%NAME%`` with its setting; an unknown name is an error naming ``where``."""
        def one(match: re.Match) -> str:
            value = self.get(match[1])
            if value is None:
                raise ConfigError(f"{where}: app setting {match[1]!r} (from {text!r}) is not set")
            return value
        return _PERCENT.sub(one, text)

    def connection_string(self, name: str | None) -> str:
        """The connection string for a binding's ``connection`` (AzureWebJobsStorage when empty)."""
        name = name or DEFAULT_CONNECTION
        for candidate in (name, f"AzureWebJobs{name}"):
            value = self.get(candidate)
            if value:
                return value
        if self.get(f"{name}__serviceUri") or self.get(f"{name}__blobServiceUri"):
            raise ConfigError(f"connection {name!r} is identity based ({name}__serviceUri); the devhost needs a "
                              f"connection string in {name}, for example the Azurite one from `upwell up`")
        raise ConfigError(f"connection {name!r}: set {name} to a storage connection string "
                          "(locally: UseDevelopmentStorage=true or the Azurite one)")
