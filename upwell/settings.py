"""Settings, read once at the edge into a frozen, typed object.

Each field has one default and one environment variable; a bad value raises
ConfigError naming the variable.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from upwell import names
from upwell.errors import ConfigError


@dataclass(frozen=True)
class PoolSpec:
    """One pool's configuration, read once from settings (UPWELL_POOLS). Plain data: the backends
    (``upwell.pools``) and the policy read it; settings never imports a backend."""

    name: str
    backend: str = "local"
    vm_size: str = "local"
    tasks_per_node: int = 1
    min_nodes: int = 0
    max_nodes: int = 2
    spot_share: float = 0.0  # fraction of nodes asked for as spot
    price_key: str = "local"
    activation_threshold: int = 1
    max_step: int = 10
    scale_down_votes: int = 3
    cooldown_s: float = 60.0
    budget_usd: float | None = None
    max_wall_clock_s: float | None = None  # a job on this pool runs at most this long (the kill switch)
    max_shard_wall_clock_s: float | None = None  # one attempt of a shard runs at most this long
    options: dict = field(default_factory=dict)  # backend-specific: image, identity, subnet ...


# Local pools are priced as the VM sizes that bicep/main.bicep deploys by default (cpuVmSize, mpiVmSize,
# gpuVmSize), so a local report's "the same on Azure" is what the default deployment would cost.
AZURE_DEFAULT_SIZES = {"cpu": "Standard_D4s_v5", "mpi": "Standard_D32s_v4", "gpu": "Standard_NC24ads_A100_v4"}


def _default_pools() -> dict[str, PoolSpec]:
    cores = os.cpu_count() or 2
    maxima = {"cpu": cores, "mpi": max(1, cores // 2), "gpu": 1}
    return {name: PoolSpec(name, backend="local", max_nodes=maxima[name], price_key=AZURE_DEFAULT_SIZES[name],
                           scale_down_votes=2, cooldown_s=10.0) for name in ("cpu", "mpi", "gpu")}


# Account-wide settings that every cloud pool shares unless its own options say otherwise.
_SHARED_OPTIONS = {"account_url": "UPWELL_BATCH_ACCOUNT_URL", "subscription_id": "UPWELL_SUBSCRIPTION_ID",
                   "resource_group": "UPWELL_RESOURCE_GROUP", "identity_id": "UPWELL_WORKER_IDENTITY_ID"}


def _with_shared_options(spec: dict, name: str, env: dict[str, str]) -> dict:
    if spec.get("backend", "local") == "local":
        return spec
    options = dict(spec.get("options") or {})
    for key, var in _SHARED_OPTIONS.items():
        if env.get(var):
            options.setdefault(key, env[var])
    gpu = bool(options.get("gpu")) or name == "gpu"
    image_var = "UPWELL_WORKER_IMAGE_GPU" if gpu else "UPWELL_WORKER_IMAGE_CPU"
    if env.get(image_var):
        options.setdefault("image", env[image_var])
    return {**spec, "options": options}


def parse_pools(text: str, env: dict[str, str] | None = None) -> dict[str, PoolSpec]:
    """Parse UPWELL_POOLS: a JSON object of pool name to PoolSpec fields.

    When every pool named is local, the setting changes the local defaults: a named default pool keeps
    the fields it does not set (its cooldown, price key ...), the pools it does not name stay, and
    ``"gpu": null`` removes one. A setting that names any cloud pool is the whole pool set.
    Cloud pools take the account-wide app settings (UPWELL_BATCH_ACCOUNT_URL, UPWELL_SUBSCRIPTION_ID,
    UPWELL_RESOURCE_GROUP, UPWELL_WORKER_IDENTITY_ID, UPWELL_WORKER_IMAGE_CPU/GPU) as option defaults.
    """
    env = dict(os.environ if env is None else env)
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"UPWELL_POOLS is not valid JSON: {exc}") from None
    if not isinstance(raw, dict) or not raw:
        raise ConfigError("UPWELL_POOLS must be a non-empty JSON object of pool name -> settings")
    known = {f.name for f in fields(PoolSpec)} - {"name"}
    local_only = all(spec is None or (isinstance(spec, dict) and spec.get("backend", "local") == "local")
                     for spec in raw.values())
    pools = _default_pools() if local_only else {}
    for name, spec in raw.items():
        if spec is None and local_only:
            pools.pop(name, None)
            continue
        if not isinstance(spec, dict):
            raise ConfigError(f"UPWELL_POOLS.{name} must be an object")
        unknown = set(spec) - known
        if unknown:
            raise ConfigError(f"UPWELL_POOLS.{name} has unknown keys {sorted(unknown)}; known: {sorted(known)}")
        inherited = {f.name: getattr(pools[name], f.name) for f in fields(PoolSpec) if f.name != "name"} \
            if local_only and name in pools else {}
        try:
            pools[name] = PoolSpec(name=name, **{**inherited, **_with_shared_options(spec, name, env)})
        except TypeError as exc:
            raise ConfigError(f"UPWELL_POOLS.{name}: {exc}") from None
    if not pools:
        raise ConfigError("UPWELL_POOLS leaves no pool")
    return pools


@dataclass(frozen=True)
class Settings:
    connection: str = "UseDevelopmentStorage=true"  # AzureWebJobsStorage
    # UPWELL_POOLS: the pools, JSON: name -> PoolSpec fields (backend, min_nodes, max_nodes, options ...)
    pools: dict[str, PoolSpec] = field(default_factory=_default_pools)
    scale_schedule: str = "*/3 * * * * *"  # UPWELL_SCALE_SCHEDULE: the scale timer (NCRONTAB; Azure: every 30 s)
    # UPWELL_MAX_UPLOAD_BYTES: the largest upload ingest takes. Ingest streams a drop and its shards reference
    # it (upwell.shardref), so nothing is held whole in memory: the default fits instrument drops of tens of GB.
    max_upload_bytes: int = 64 * 1024**3
    max_shards: int = 100_000  # UPWELL_MAX_SHARDS: the most shards (grid points, row blocks, files) one job may make
    max_message_bytes: int = 64 * 1024  # UPWELL_MAX_MESSAGE_BYTES: the largest work item (the queue limit is 64 KiB)
    max_param_bytes: int = 16 * 1024  # UPWELL_MAX_PARAM_BYTES: the largest parameter set of one shard
    max_concurrency: int = 0  # UPWELL_MAX_CONCURRENCY: running shards per job, 0 = no cap
    # UPWELL_IMAGE_ALLOWLIST: image names the built-in definitions may use (comma-separated)
    image_allowlist: tuple[str, ...] = ("upwell-mpi", "upwell-gpu")
    # UPWELL_REGISTRY_ALLOWLIST: registries a pushed definition's image may come from (host names, comma-separated;
    # '*' patterns allowed).
    registry_allowlist: tuple[str, ...] = ("*.azurecr.io",)
    code_version: str = ""  # UPWELL_CODE_VERSION: the code version results record (else git describe)
    image_digest: str = "local"  # UPWELL_IMAGE_DIGEST: the worker image digest results record
    reconcile_schedule: str = "0 */5 * * * *"  # UPWELL_RECONCILE_SCHEDULE: the reconciler timer (NCRONTAB, every 5 min)
    reconcile_grace_s: int = 120  # UPWELL_RECONCILE_GRACE_S: younger blobs may still have an event on its way
    reconcile_max_actions: int = 200  # UPWELL_RECONCILE_MAX_ACTIONS: re-drives per pass (the rest: next pass)
    reconcile_max_redrives: int = 3  # UPWELL_RECONCILE_MAX_REDRIVES: then the input is quarantined
    # UPWELL_INGEST_LEASE_S: an ingest renews its lease on the job row every sixth of this while it writes;
    # the reconciler re-drives an ingesting job only once its lease is this old (upwell.ingest.lease).
    ingest_lease_s: int = 30
    # UPWELL_RECONCILE_SOURCE: how a pass finds incoming/ uploads: "listing" (list incoming/, check only blobs
    # past a last-modified watermark) or "changefeed" (read the blob change feed from a cursor; Azure only,
    # where the Bicep enables the feed; an account without one is listed).
    reconcile_source: str = "listing"
    # UPWELL_SCALE_ON_INGEST: ingest runs a scale pass once it enqueued work, so dispatch does not wait for
    # the timer's next tick. Where the scale timer runs in the same app (upwell up, the Function App).
    scale_on_ingest: bool = False
    project: str = "default"  # UPWELL_PROJECT: a job's project when its manifest names none
    # UPWELL_BUDGETS: {"owner": {"lead@lab.org": 50}, "project": {"ocean": 500}}, USD per window
    budgets: dict = field(default_factory=dict)
    budget_window_days: float = 30.0  # UPWELL_BUDGET_WINDOW_DAYS: the window UPWELL_BUDGETS are spent over
    data_wait_s: int = 600  # UPWELL_DATA_WAIT_S: how long a manifest waits for its data/ blobs (0: not at all)
    enqueue_workers: int = 8  # UPWELL_ENQUEUE_WORKERS: work items an ingest has in flight
    # UPWELL_ENQUEUE_PER_S: work items an ingest sends per second at most (0: no cap); Queue Storage's
    # target for one queue is 2,000 messages/s (upwell.ingest.fanout)
    enqueue_per_s: int = 2000
    # UPWELL_ACCESS_SCOPE: the storage account's resource id that `upwell access` grants roles on (Azure);
    # empty: the local stack's roles file (UPWELL_ACCESS_FILE)
    access_scope: str = ""
    # UPWELL_ACCESS_FILE: the local stack's role assignments; without the file its one user operates it
    access_file: str = ".upwell/access.json"
    # UPWELL_PRINCIPAL: who the CLI acts as on the local stack (default: the login name); on Azure the
    # signed-in identity's object id is read from its token instead
    principal: str = ""
    # UPWELL_PROJECT_FOLDERS: a job's project is its upload's first folder (incoming/<project>/); a manifest
    # naming another is refused. On in the Azure deployment, where the uploaders' role conditions are per folder
    project_folders: bool = False
    # UPWELL_PROJECT_ROLES: which projects a signed-in caller may see and act on, by Entra app role or
    # group object id: {"ocean.members": ["ocean"], "<group id>": ["reef"], "upwell.operator": ["*"]}
    project_roles: dict = field(default_factory=dict)
    cli_start_wait_s: int = 20  # UPWELL_CLI_START_WAIT_S: how long a command waits for a stack still starting
    quarantine_max_rows: int = 100  # UPWELL_QUARANTINE_MAX_ROWS: bad rows a rejected CSV's .error.json lists
    notify_attempts: int = 5  # UPWELL_NOTIFY_ATTEMPTS: tries of one notification before it is recorded failed
    notify_backoff_s: float = 2.0  # UPWELL_NOTIFY_BACKOFF_S: wait before the 2nd try, doubling each time after
    notify_timeout_s: float = 10.0  # UPWELL_NOTIFY_TIMEOUT_S: how long one webhook try waits for an answer
    secrets_dir: str = ""  # UPWELL_SECRETS_DIR: local folder of webhook secrets, one file per secret name
    key_vault_url: str = ""  # UPWELL_KEY_VAULT_URL: Key Vault holding webhook secrets by name (Azure)
    eventgrid_endpoint: str = ""  # UPWELL_EVENTGRID_ENDPOINT: the custom topic job events go to (Azure)
    # UPWELL_BLOCK_TARGET_S: points_per_item: auto puts this many seconds of estimated work in one work item
    block_target_s: int = 30
    block_max: int = 64  # UPWELL_BLOCK_MAX: the most grid points points_per_item: auto puts in one work item

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        env = dict(os.environ if env is None else env)
        kw: dict[str, Any] = {}
        conn = env.get(names.CONNECTION)
        if conn:
            kw["connection"] = conn
        elif any(env.get(f"{names.CONNECTION}__{k}") for k in ("serviceUri", "blobServiceUri", "accountName")):
            kw["connection"] = "identity"
        if env.get("UPWELL_POOLS"):
            kw["pools"] = parse_pools(env["UPWELL_POOLS"], env)
        for name, var in _INTS:
            if env.get(var):
                kw[name] = env_int(env, var, 0, minimum=0)
        for name, var in _TEXTS + _BOOLS:
            if env.get(var):
                kw[name] = _PARSE.get(name, _text)(env, var)
        if env.get("UPWELL_IMAGE_ALLOWLIST"):
            kw["image_allowlist"] = tuple(s.strip() for s in env["UPWELL_IMAGE_ALLOWLIST"].split(",") if s.strip())
        if env.get("UPWELL_REGISTRY_ALLOWLIST"):
            kw["registry_allowlist"] = tuple(s.strip() for s in env["UPWELL_REGISTRY_ALLOWLIST"].split(",")
                                             if s.strip())
        kw.update(cost_settings(env))
        kw.update(access_settings(env))
        kw.update(after_settings(env))
        return cls(**kw)


def cost_settings(env: Mapping[str, str]) -> dict[str, Any]:
    """UPWELL_PROJECT, UPWELL_BUDGETS and UPWELL_BUDGET_WINDOW_DAYS, where set."""
    kw: dict[str, Any] = {}
    if env.get("UPWELL_PROJECT"):
        kw["project"] = env["UPWELL_PROJECT"]
    if env.get("UPWELL_BUDGETS"):
        kw["budgets"] = _budgets(env["UPWELL_BUDGETS"])
    if env.get("UPWELL_BUDGET_WINDOW_DAYS"):
        kw["budget_window_days"] = env_float(env, "UPWELL_BUDGET_WINDOW_DAYS", 30.0, minimum=0)
    return kw


def after_settings(env: Mapping[str, str]) -> dict[str, Any]:
    """The notification settings (upwell.after), where set."""
    kw: dict[str, Any] = {}
    if env.get("UPWELL_NOTIFY_ATTEMPTS"):
        kw["notify_attempts"] = env_int(env, "UPWELL_NOTIFY_ATTEMPTS", 5, minimum=1)
    for name, var in (("notify_backoff_s", "UPWELL_NOTIFY_BACKOFF_S"), ("notify_timeout_s", "UPWELL_NOTIFY_TIMEOUT_S")):
        if env.get(var):
            kw[name] = env_float(env, var, 0.0, minimum=0)
    for name, var in (("secrets_dir", "UPWELL_SECRETS_DIR"), ("key_vault_url", "UPWELL_KEY_VAULT_URL"),
                      ("eventgrid_endpoint", "UPWELL_EVENTGRID_ENDPOINT")):
        if env.get(var):
            kw[name] = env[var]
    return kw


def _budgets(text: str) -> dict[str, dict[str, float]]:
    """UPWELL_BUDGETS: {"owner": {name: usd}, "project": {name: usd}}."""
    try:
        raw = json.loads(text)
        out = {kind: {str(k): float(v) for k, v in (raw.get(kind) or {}).items()} for kind in ("owner", "project")}
    except (ValueError, TypeError, AttributeError):
        raise ConfigError('UPWELL_BUDGETS must be JSON like {"owner": {"lead": 50}, "project": {"ocean": 500}}') \
            from None
    unknown = set(raw) - {"owner", "project"}
    if unknown:
        raise ConfigError(f"UPWELL_BUDGETS has unknown keys {sorted(unknown)}; known: owner, project")
    return out


def access_settings(env: Mapping[str, str]) -> dict[str, Any]:
    """UPWELL_PROJECT_ROLES, where set (upwell.access.principal reads it)."""
    return {"project_roles": parse_project_roles(env["UPWELL_PROJECT_ROLES"])} if env.get("UPWELL_PROJECT_ROLES") \
        else {}


def parse_project_roles(text: str) -> dict[str, tuple[str, ...]]:
    """UPWELL_PROJECT_ROLES: a JSON object of app role or group id -> the projects it opens ("*": all)."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"UPWELL_PROJECT_ROLES is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError('UPWELL_PROJECT_ROLES must be a JSON object like {"ocean.members": ["ocean"]}')
    out = {}
    for role, projects in raw.items():
        projects = [projects] if isinstance(projects, str) else projects
        if not isinstance(projects, list) or not all(isinstance(p, str) and p for p in projects):
            raise ConfigError(f"UPWELL_PROJECT_ROLES.{role} must be a project name or a list of them")
        out[str(role)] = tuple(projects)
    return out


_INTS = (("max_upload_bytes", "UPWELL_MAX_UPLOAD_BYTES"), ("max_shards", "UPWELL_MAX_SHARDS"),
         ("max_message_bytes", "UPWELL_MAX_MESSAGE_BYTES"), ("max_param_bytes", "UPWELL_MAX_PARAM_BYTES"),
         ("max_concurrency", "UPWELL_MAX_CONCURRENCY"), ("data_wait_s", "UPWELL_DATA_WAIT_S"),
         ("reconcile_grace_s", "UPWELL_RECONCILE_GRACE_S"), ("reconcile_max_actions", "UPWELL_RECONCILE_MAX_ACTIONS"),
         ("reconcile_max_redrives", "UPWELL_RECONCILE_MAX_REDRIVES"), ("ingest_lease_s", "UPWELL_INGEST_LEASE_S"),
         ("enqueue_workers", "UPWELL_ENQUEUE_WORKERS"), ("enqueue_per_s", "UPWELL_ENQUEUE_PER_S"),
         ("cli_start_wait_s", "UPWELL_CLI_START_WAIT_S"), ("quarantine_max_rows", "UPWELL_QUARANTINE_MAX_ROWS"),
         ("block_target_s", "UPWELL_BLOCK_TARGET_S"), ("block_max", "UPWELL_BLOCK_MAX"))
_BOOLS = (("scale_on_ingest", "UPWELL_SCALE_ON_INGEST"), ("project_folders", "UPWELL_PROJECT_FOLDERS"))


def _text(env: Mapping[str, str], var: str) -> str:
    return env[var]
_TEXTS = (("scale_schedule", "UPWELL_SCALE_SCHEDULE"), ("reconcile_schedule", "UPWELL_RECONCILE_SCHEDULE"),
          ("reconcile_source", "UPWELL_RECONCILE_SOURCE"),
          ("code_version", "UPWELL_CODE_VERSION"),
          ("image_digest", "UPWELL_IMAGE_DIGEST"),
          ("access_scope", "UPWELL_ACCESS_SCOPE"), ("access_file", "UPWELL_ACCESS_FILE"),
          ("principal", "UPWELL_PRINCIPAL"))


def env_int(env: Mapping[str, str], var: str, default: int, *, minimum: int | None = None) -> int:
    """An integer setting; a bad value raises ConfigError naming ``var``."""
    text = env.get(var)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{var} must be an integer, got {text!r}") from None
    if minimum is not None and value < minimum:
        raise ConfigError(f"{var} must be >= {minimum}, got {value}")
    return value


def env_float(env: Mapping[str, str], var: str, default: float, *, minimum: float | None = None) -> float:
    """A number setting; a bad value raises ConfigError naming ``var``."""
    text = env.get(var)
    if text is None or text == "":
        return default
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{var} must be a number, got {text!r}") from None
    if minimum is not None and value < minimum:
        raise ConfigError(f"{var} must be >= {minimum}, got {value}")
    return value


def env_bool(env: Mapping[str, str], var: str, default: bool = False) -> bool:
    """A yes/no setting (1/true/yes or 0/false/no, any case); anything else raises ConfigError naming ``var``."""
    text = (env.get(var) or "").strip().lower()
    if not text:
        return default
    if text in ("1", "true", "yes"):
        return True
    if text in ("0", "false", "no"):
        return False
    raise ConfigError(f"{var} must be true or false, got {env.get(var)!r}")


RECONCILE_SOURCES = ("listing", "changefeed")


def _reconcile_source(env: Mapping[str, str], var: str) -> str:
    value = env[var].strip().lower()
    if value not in RECONCILE_SOURCES:
        raise ConfigError(f"{var} must be one of {', '.join(RECONCILE_SOURCES)}, got {env[var]!r}")
    return value


_PARSE = {"scale_on_ingest": env_bool, "reconcile_source": _reconcile_source, "project_folders": env_bool}
