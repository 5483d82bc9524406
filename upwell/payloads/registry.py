"""The one registry of payload definitions: built-in files plus the ``payloads`` container.

Built-ins are the YAML files in the repo's ``payloads/`` folder, deployed with the
app. Registered definitions are blobs ``payloads/<name>/<version>.yaml`` that an
operator pushes (``upwell payload push``); the container's write role is separate
from the uploaders'. A version, once pushed, never changes: pushing other bytes
under the same version is refused, except for the version ``dev``: a tag that a lab pushes over while it
tries a tool (a manifest names it as ``name@dev``; a bare name never resolves to it). A name resolves to
its newest version unless the manifest pins one (``payload: name@version``). Registered names may not
shadow built-ins. ``delete`` removes a pushed version. Neither a delete nor a push over ``dev`` happens
while an open job runs that version (``PayloadInUse``): its agents resolve the exact content ingest
validated. The registry keeps no state beyond a cache of built-ins.
"""

from __future__ import annotations

import functools
from pathlib import Path
from urllib.parse import quote

from packaging.version import InvalidVersion, Version

from upwell import REPO, names
from upwell.errors import InputRejected, NotFound
from upwell.payloads.validate import Loaded, load

BUILTIN_DIR = REPO / "payloads"
DEV = "dev"  # the one version that a push may overwrite


class PayloadInUse(InputRejected):
    """A pushed version that an open job runs: it is neither deleted nor overwritten until the job ends."""


def users(ledger, name: str, version: str) -> list[str]:
    """The open jobs (upwell.ledger, through its index of open jobs) that run ``name@version``."""
    return sorted(j.job_id for j in ledger.open_jobs() if j.payload == name and j.payload_version == version)


def _refuse_in_use(ledger, name: str, version: str, doing: str) -> None:
    using = users(ledger, name, version) if ledger is not None else []
    if using:
        more = f" and {len(using) - 5} more" if len(using) > 5 else ""
        raise PayloadInUse(f"{name}@{version} is not {doing}: open job(s) {', '.join(using[:5])}{more} run it; "
                           "cancel them (upwell cancel JOB) or wait until they end", field="version")


@functools.cache
def _builtins(folder: Path, allowlist: tuple[str, ...]) -> dict[str, Loaded]:
    out: dict[str, Loaded] = {}
    for path in sorted(folder.glob("*.yaml")):
        loaded = load(path.read_bytes(), f"payloads/{path.name}", allowlist, builtin=True)
        if loaded.definition.name in out:
            raise InputRejected(f"payloads/{path.name}: name {loaded.definition.name!r} is defined twice",
                                field="name", source=f"payloads/{path.name}")
        out[loaded.definition.name] = loaded
    return out


def builtins(allowlist: tuple[str, ...] = ("*",), folder: Path = BUILTIN_DIR) -> dict[str, Loaded]:
    """Built-in definitions by name. They are operator code, reviewed with the repo, so every registry
    host passes here; the allowlist governs what is pushed at run time."""
    return _builtins(folder, allowlist)


def split_ref(ref: str) -> tuple[str, str | None]:
    """'name' or 'name@version'."""
    name, _, version = ref.partition("@")
    return name, (version or None)


def _version_key(version: str):
    try:
        return (1, Version(version), version)
    except InvalidVersion:
        return (0, Version("0"), version)


class Registry:
    """Resolves, lists and pushes definitions. ``storage`` None: built-ins only (a machine without storage)."""

    def __init__(self, storage=None, allowlist: tuple[str, ...] = ("*.azurecr.io",), folder: Path = BUILTIN_DIR):
        self.storage = storage
        self.allowlist = tuple(allowlist)
        self.folder = folder

    # -- reading ------------------------------------------------------------------------
    def resolve(self, ref: str, *, sha256: str = "") -> Loaded:
        """The definition a manifest or work item names; InputRejected(field='payload') when none.
        With ``sha256`` the exact content is required (a worker runs what ingest validated)."""
        name, version = split_ref(ref)
        builtin = builtins(folder=self.folder).get(name)
        if builtin is not None:
            if version and version != builtin.definition.version:
                raise InputRejected(f"payload {ref!r}: the built-in {name} is version "
                                    f"{builtin.definition.version}", field="payload")
            found = builtin
        else:
            found = self._registered(name, version)
        if sha256 and found.sha256 != sha256:
            raise InputRejected(f"payload {found.ref} has content {found.sha256}, not {sha256} that was "
                                "validated at ingest (was it changed?)", field="payload")
        return found

    def _registered(self, name: str, version: str | None) -> Loaded:
        versions = self.versions(name)
        if not versions:
            known = sorted(set(builtins(folder=self.folder)) | set(self._names()))
            raise InputRejected(f"payload {name!r} is not registered; known: {known}", field="payload")
        released = [v for v in versions if v != DEV]
        if not version and not released:
            raise InputRejected(f"payload {name!r} has only a {DEV} version: name it as {name}@{DEV}",
                                field="payload")
        chosen = version or released[-1]
        if chosen not in versions:
            raise InputRejected(f"payload {name}@{chosen} is not registered; versions: {versions}",
                                field="payload")
        blob = f"{name}/{chosen}.yaml"
        return load(self.storage.read(f"{names.PAYLOADS}/{blob}"), f"{names.PAYLOADS}/{blob}", self.allowlist)

    def versions(self, name: str) -> list[str]:
        if self.storage is None:
            return []
        try:
            found = [b.name[len(name) + 1:-5] for b in self.storage.list(names.PAYLOADS, f"{name}/")
                     if b.name.endswith(".yaml") and "/" not in b.name[len(name) + 1:]]
        except NotFound:  # no payloads container yet: nothing registered
            return []
        return sorted(found, key=_version_key)

    def _names(self) -> list[str]:
        if self.storage is None:
            return []
        try:
            return sorted({b.name.split("/", 1)[0] for b in self.storage.list(names.PAYLOADS) if "/" in b.name})
        except NotFound:  # no payloads container yet: nothing registered
            return []

    def names(self) -> list[str]:
        """Every payload a manifest may name: built-in and registered."""
        return sorted(set(builtins(folder=self.folder)) | set(self._names()))

    def list(self) -> list[Loaded]:
        """Every built-in and every registered version, built-ins first."""
        out = list(builtins(folder=self.folder).values())
        for name in self._names():
            out += [self._registered(name, v) for v in self.versions(name)]
        return out

    # -- writing (operators) --------------------------------------------------------------
    def push(self, data: bytes, source: str, *, pushed_by: str = "", ledger=None) -> tuple[Loaded, bool]:
        """Validate and store one definition; (loaded, False) when the same bytes were already there. Other
        bytes under a pushed version are refused, except under ``dev``, which they replace unless an open job
        in ``ledger`` runs it (PayloadInUse). ``pushed_by`` (the operator, upwell.access.caller) is kept in the
        blob's metadata."""
        loaded = load(data, source, self.allowlist)
        d = loaded.definition
        if d.name in builtins(folder=self.folder):
            raise InputRejected(f"{source}: {d.name!r} is a built-in payload; it changes with the app's "
                                "payloads/ folder, not by push", field="name", source=source)
        path = f"{names.PAYLOADS}/{d.name}/{d.version}.yaml"
        meta = _metadata(loaded, pushed_by)
        try:
            created = self.storage.write(path, data, overwrite=False, content_type="application/yaml",
                                         metadata=meta)
        except NotFound:
            raise InputRejected(f"the {names.PAYLOADS} container does not exist: deploy (bicep/) or run "
                                "`upwell up` first", field="storage", source=source) from None
        if created:
            return loaded, True
        if load(self.storage.read(path), path, ("*",)).sha256 == loaded.sha256:
            return loaded, False
        if d.version != DEV:
            raise InputRejected(f"{source}: {d.name}@{d.version} is already registered with other content; "
                                f"a version never changes: raise the version (only {DEV} may be pushed over)",
                                field="version", source=source)
        _refuse_in_use(ledger, d.name, DEV, "pushed over")
        self.storage.write(path, data, overwrite=True, content_type="application/yaml", metadata=meta)
        return loaded, True

    def delete(self, ref: str, ledger) -> str:
        """Remove the pushed version ``name@version``; refused for a built-in, a version that is not there,
        and one that an open job in ``ledger`` runs (PayloadInUse). The blob deleted."""
        name, version = split_ref(ref)
        if not version:
            raise InputRejected(f"{ref!r}: name the version to delete, as NAME@VERSION; versions: "
                                f"{self.versions(name)}", field="version")
        if name in builtins(folder=self.folder):
            raise InputRejected(f"{name!r} is a built-in payload; it changes with the app's payloads/ folder",
                                field="name")
        if version not in self.versions(name):
            raise InputRejected(f"payload {name}@{version} is not registered; versions: {self.versions(name)}",
                                field="version")
        _refuse_in_use(ledger, name, version, "deleted")
        path = f"{names.PAYLOADS}/{name}/{version}.yaml"
        self.storage.delete(path)
        return path


def _metadata(loaded: Loaded, pushed_by: str) -> dict[str, str]:
    """A pushed definition's blob metadata: its content hash, and who pushed it (quoted: metadata is ASCII)."""
    meta = {"sha256": loaded.sha256.split(":", 1)[1]}
    if pushed_by:
        meta["pushed_by"] = quote(pushed_by, safe="@.-_")
    return meta
