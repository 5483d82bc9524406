"""Uploads as a collaborator makes them: files and folders into incoming/, rules into pipelines/.

Inside a folder, data files go up before the manifest, so the manifest never
names a blob that is not there yet. ``check`` refuses, before any upload, what ingest would: among it a
shape the pool cannot run (upwell.shape: TooManyNodes, GangUnsupported, Oversubscribed), the shape resolved
as ingest resolves it and checked as ingest checks it (upwell.ingest.poolfit); a GangUnsupported names the
configured pools that can run the shard, or says that none is configured.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from upwell import names
from upwell.ingest.blobnames import MANIFEST_NAMES, check_name, is_manifest, is_manifest_input, job_id_for
from upwell.storage import Storage

SKIP = {".DS_Store", "Thumbs.db"}


@dataclass(frozen=True)
class Uploaded:
    local: Path
    blob: str  # the name under incoming/
    job_id: str | None  # None for a manifest's inputs


def _files(path: Path, prefix: str) -> list[tuple[Path, str]]:
    if path.is_file():
        return [(path, f"{prefix}{path.name}")]
    if not path.is_dir():
        raise FileNotFoundError(f"{path} does not exist")
    pairs = [(f, f"{prefix}{path.name}/{f.relative_to(path).as_posix()}") for f in sorted(path.rglob("*"))
             if f.is_file() and f.name not in SKIP and not f.name.startswith(".")]
    return sorted(pairs, key=lambda p: (p[1].rsplit("/", 1)[-1] in MANIFEST_NAMES or is_manifest(p[1]), p[1]))


@dataclass(frozen=True)
class Plan:
    """What one manifest will become, worked out before anything is uploaded."""

    blob: str  # the manifest's name under incoming/
    payload: str
    pool: str
    shards: int | None  # None: not known before ingest (data that is already in storage)
    node_seconds: float
    usd: float
    price_key: str
    spot: bool
    budget_usd: float | None
    nodes: int = 1  # nodes of one allocation per shard (upwell.shape)
    usd_low: float = 0.0  # the estimate's range (upwell.cost.forecast)
    usd_high: float = 0.0
    basis: str = ""  # what the estimate rests on: the manifest, or results blended with it


def check(storage: Storage | None, paths: list[Path], prefix: str = "", settings=None) -> list[Plan]:
    """Validate every upload as ingest will: names, manifests (payload, pool, grid, data, budget) and
    that instrument files match a rule. Raises InputRejected naming the file and field; uploads nothing."""
    from upwell.settings import Settings

    settings = settings or Settings.from_env()
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    pairs = [pair for path in paths for pair in _files(Path(path), prefix)]
    uploading = {name: local for local, name in pairs}
    plans = []
    for local, name in pairs:
        check_name(name)
        if is_manifest(name):
            plans.append(_plan(storage, local, name, uploading, settings))
        elif not is_manifest_input(name) and storage is not None:
            from upwell.ingest.rulematch import match_rule
            from upwell.payloads.registry import Registry

            match_rule(storage, Registry(storage, settings.registry_allowlist), name)
    return plans


def _plan(storage: Storage | None, local: Path, name: str, uploading: dict[str, Path], settings) -> Plan:
    from upwell.errors import InputRejected
    from upwell.ingest import manifests
    from upwell.ingest.ingestor import Ingestor
    from upwell.payloads.registry import split_ref

    definitions = Ingestor(storage, settings).definitions if storage is not None else None
    m = manifests.load_manifest(local.read_bytes(), f"{names.INCOMING}/{name}",
                                definitions.names() if definitions else None)
    spec = definitions.resolve(m.payload) if definitions else None
    definition = spec.definition if spec else None
    pool = m.pool or (definition.pool if definition else "cpu")
    if pool not in settings.pools:
        raise InputRejected(f"incoming/{name}: pool {pool!r} is not configured; pools: {sorted(settings.pools)}",
                            field="pool")
    if m.image and m.image not in settings.image_allowlist:
        raise InputRejected(f"incoming/{name}: image {m.image!r} is not on the allowlist", field="image")
    resources = _check_shape(name, m, definition, pool, settings)
    if m.data:
        points = manifests.grid_points(m.model_copy(update={"grid": {}}), settings.max_shards,
                                       settings.max_param_bytes, definition)
        shards = _data_shards(storage, name, m, uploading, settings)
        points = points[:1] * (shards or 0)
    else:
        points, shards = _grid(m, settings, definition)
    price_key = settings.pools[pool].price_key
    e = _estimate(storage, definition.name if definition else split_ref(m.payload)[0], m, pool, points, settings,
                  resources)
    if shards and m.budget_usd is not None and e.usd > m.budget_usd:
        raise InputRejected(f"incoming/{name}: estimated cost ${e.usd:.2f} ({e.node_seconds:.0f} node-seconds on "
                            f"{price_key}) exceeds the budget ${m.budget_usd:.2f}", field="budget_usd")
    return Plan(name, m.payload, pool, shards, e.node_seconds, e.usd, price_key, m.spot, m.budget_usd,
                resources.nodes, e.usd_low, e.usd_high, e.basis)


def _grid(m, settings, definition) -> tuple[list[dict], int]:
    """A grid's points (each priced) and its work items, as ingest makes them: one per point, or one per block of
    ``points_per_item`` (upwell.ingest.blocks; a block that cannot fit is refused here as at ingest)."""
    from upwell.ingest import blocks, manifests
    from upwell.ingest.fanout import GridShards
    from upwell.payloads.registry import Registry

    k, fit = blocks.size_for(m, settings.block_target_s, settings.block_max)
    if k == 1:
        points = manifests.grid_points(m, settings.max_shards, settings.max_param_bytes, definition)
        return points, len(points)
    grid = GridShards(m, settings.max_shards, settings.max_param_bytes,
                      definition or Registry().resolve(m.payload).definition, k=k, fit=fit)
    return [{**shard[1], **own} for shard in grid for own in shard[5]], len(grid)


def _check_shape(name: str, m, definition, pool: str, settings):
    """The shard's resources as ingest resolves them (the definition's, each field the manifest gives
    instead), held against the pool as ingest holds them (upwell.ingest.poolfit); its named error, with the
    upload's name, when the pool cannot run them."""
    from types import SimpleNamespace

    from upwell import shape
    from upwell.ingest import manifests, poolfit
    from upwell.ingest.ingestor import Ingestor

    resources = Ingestor._resources(m, definition or SimpleNamespace(resources=manifests.Resources()))
    poolfit.check(shape.Shape(resources.nodes, resources.ranks, resources.oversubscribe), settings.pools, pool,
                  where=f"incoming/{name}")
    return resources


def _estimate(storage: Storage | None, payload: str, m, pool: str, points: list[dict], settings, resources):
    """The estimate ingest will make (upwell.cost.forecast.for_job, the one function both call): the pool's
    price and spot share, node time learned from earlier results where the account has them, blended with the
    manifest's figure, times the nodes of a shard."""
    from upwell.cost import forecast as est
    from upwell.ledger import Ledger

    return est.for_job(Ledger(storage) if storage is not None else None, payload=payload, pool=pool,
                       spec=settings.pools[pool], points=points, manifest_s=m.estimate.node_seconds_per_shard,
                       spot=bool(m.spot), resources=resources)


def _data_shards(storage: Storage | None, name: str, m, uploading: dict[str, Path], settings) -> int | None:
    """Shards the manifest's data will make (counted from the local files); each data blob must be
    among the uploads or already in incoming/."""
    from upwell.errors import InputRejected
    from upwell.ingest.parquetshards import local_shards
    from upwell.ingest.sharding import shard_csv

    folder = name.rsplit("/", 1)[0] if "/" in name else ""
    total: int | None = 0
    for i, ref in enumerate(m.data):
        blob = ref[len(names.INCOMING) + 1:] if ref.startswith(f"{names.INCOMING}/") else \
            f"{folder}/{ref}".lstrip("/").replace("//", "/")
        local = uploading.get(blob)
        if local is None:
            if storage is None or not storage.exists(f"{names.INCOMING}/{blob}"):
                raise InputRejected(f"incoming/{name}: data[{i}] {ref!r} is neither among the files being "
                                    f"uploaded nor in incoming/ (looked for incoming/{blob})", field=f"data[{i}]")
            total = None
            continue
        if total is not None and blob.endswith(".parquet"):
            total += local_shards(local, source=f"{names.INCOMING}/{blob}", rows_per_shard=m.shard.rows,
                                  bytes_per_shard=m.shard.bytes, max_shards=settings.max_shards)
        elif total is not None:
            with open(local, "rb") as fh:
                chunks = iter(lambda: fh.read(1 << 20), b"")
                total += sum(1 for _ in shard_csv(chunks, source=f"{names.INCOMING}/{blob}",
                                                  rows_per_shard=m.shard.rows, bytes_per_shard=m.shard.bytes,
                                                  max_shards=settings.max_shards))
    return total


def submit(storage: Storage, paths: list[Path], prefix: str = "") -> list[Uploaded]:
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    out = []
    for path in paths:
        for local, name in _files(Path(path), prefix):
            check_name(name)
            with open(local, "rb") as fh:
                etag = storage.put(f"{names.INCOMING}/{name}", fh, metadata={"uploaded_by": uploader()})
            job = None if is_manifest_input(name) and not is_manifest(name) else job_id_for(name, etag)
            out.append(Uploaded(local, name, job))
    return out


def uploader() -> str:
    """Who uploads, for the job's owner when its manifest names none: UPWELL_OWNER, else the login name."""
    import getpass
    import os

    try:
        return os.environ.get("UPWELL_OWNER") or getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def push_rules(storage: Storage, paths: list[Path]) -> list[str]:
    pushed = []
    for path in paths:
        files = [path] if Path(path).is_file() else sorted(Path(path).glob("*.y*ml"))
        for f in files:
            storage.write(f"{names.PIPELINES}/{f.name}", f.read_bytes())
            pushed.append(f.name)
    return pushed
