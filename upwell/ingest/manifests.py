"""Job manifests and pipeline rules, validated with pydantic.

Errors name the field (``grid.r[3]``), the row, or the limit that failed.
The documents are read by ``upwell.documents`` (the safe loader only, alias bombs refused);
a manifest's payload and params are checked against the payload registry's definitions.
"""

from __future__ import annotations

import fnmatch
import hashlib
import itertools
import json
import math
import re
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from upwell.after.spec import JOB_REF, NotifySpec, ReduceSpec
from upwell.documents import parse_document
from upwell.errors import InputRejected
from upwell.payloads import params as payload_params
from upwell.payloads.registry import Registry, builtins

MAX_POINTS_PER_ITEM = 10_000  # a block's points also fit a work item and a table property (upwell.ingest.blocks)
PAYLOAD_REF = r"[a-z][a-z0-9-]{0,62}(@[0-9A-Za-z][0-9A-Za-z.+-]{0,63})?"


class Resources(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    ranks: int = Field(1, ge=1, le=1024)
    gpus: int = Field(0, ge=0, le=16)
    nodes: int = Field(1, ge=1, le=64)
    ranks_per_node: int | None = Field(None, ge=1, le=1024)
    oversubscribe: bool = False


class Estimate(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    node_seconds_per_shard: float = Field(10.0, gt=0, le=30 * 24 * 3600)


class ShardRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    rows: int | None = Field(None, ge=1, le=10_000_000)
    bytes: int | None = Field(None, ge=1024, le=1 << 34)
    whole_files: bool = Field(False, description="each data file is one shard, as uploaded, in any format "
                                                 "(a tool's own input: FASTQ, PDB, a mesh); not split into rows")


class Manifest(BaseModel):
    """A job manifest: a payload, a pool, a parameter grid or data blobs, resources, cost limits."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field("", max_length=200)
    description: str = Field("", max_length=4000)
    payload: str
    pool: str | None = None
    image: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    data: list[str] = Field(default_factory=list, max_length=1000)
    shard: ShardRule = ShardRule(rows=1000)
    resources: Resources = Resources()
    estimate: Estimate = Estimate()
    budget_usd: float | None = Field(None, ge=0)
    spot: bool = False
    max_concurrency: int = Field(0, ge=0, le=100_000)  # running shards at once; 0: no cap of its own
    owner: str = Field("", max_length=200)  # who pays: else the uploader's identity, else "unknown"
    project: str = Field("", max_length=200)  # else UPWELL_PROJECT
    # grid points one work item carries and runs in turn (upwell.ingest.blocks); "auto": enough points that an
    # item runs about UPWELL_BLOCK_TARGET_S by the estimate, at most UPWELL_BLOCK_MAX; 1: a point per item
    points_per_item: int | Literal["auto"] = Field(1, description="grid points per work item, or 'auto'")
    max_wall_clock_s: float | None = Field(None, gt=0, le=90 * 24 * 3600)  # the job's kill switch
    max_shard_wall_clock_s: float | None = Field(None, gt=0, le=30 * 24 * 3600)  # one attempt's
    after: str = Field("", pattern=r"^(|" + JOB_REF[1:-1] + r")$")  # start once that job (id or name) succeeds
    reduce: ReduceSpec | None = None  # the job's own analysis, run once after its last shard (upwell.after)
    notify: NotifySpec | None = None  # whom to tell about completed, failed ... (upwell.after.notify)

    @field_validator("payload")
    @classmethod
    def _known_payload(cls, v: str, info: ValidationInfo) -> str:
        """A registered definition's name, optionally pinned to a version (``name@1.2.0``). The known
        names come in the validation context (the ingestor reads the registry); built-ins by default."""
        known = (info.context or {}).get("payloads") or sorted(builtins())
        if not re.fullmatch(PAYLOAD_REF, v) or v.split("@", 1)[0] not in known:
            raise ValueError(f"unknown payload {v!r}; registered: {sorted(known)}")
        return v

    @field_validator("points_per_item", mode="before")
    @classmethod
    def _points_per_item(cls, v: Any) -> Any:
        """A whole number from 1 to ``MAX_POINTS_PER_ITEM``, or "auto" (not a bool, not a float)."""
        if v == "auto":
            return v
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_POINTS_PER_ITEM:
            raise ValueError(f"points_per_item must be a whole number from 1 to {MAX_POINTS_PER_ITEM}, or 'auto'; "
                             f"got {v!r}")
        return v

    @model_validator(mode="after")
    def _blocks_of_a_grid(self) -> Manifest:
        if self.points_per_item != 1 and self.data:
            raise ValueError("points_per_item applies to a grid's points; data blobs are sharded by shard.rows, "
                             "shard.bytes or whole_files")
        return self

    @field_validator("grid")
    @classmethod
    def _grid_lists(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in v.items():
            if not values:
                raise ValueError(f"grid.{key} is empty")
        return v


class PipelineRule(BaseModel):
    """Maps a path pattern under incoming/ to a schema, a sharding rule, a payload and a pool."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = ""
    match: str = Field(..., min_length=1, max_length=512)
    # binary: HDF5, netCDF, raw instrument files go to the payload whole, as one shard (no copy)
    format: Literal["csv", "parquet", "binary"] = "csv"
    columns: dict[str, Literal["float", "int", "str"]] = Field(default_factory=dict)
    delimiter: str = Field(",", min_length=1, max_length=1)
    comment: str = Field("", max_length=8)  # lines starting with it before the header are skipped
    missing: list[str] = Field(default_factory=list, max_length=32)  # cells that mean "no value": NaN in shards
    shard: ShardRule = ShardRule(rows=1000)
    payload: str
    pool: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    estimate: Estimate = Estimate()
    budget_usd: float | None = Field(None, ge=0)
    spot: bool = False
    max_concurrency: int = Field(0, ge=0, le=100_000)
    owner: str = Field("", max_length=200)
    project: str = Field("", max_length=200)
    max_wall_clock_s: float | None = Field(None, gt=0, le=90 * 24 * 3600)
    max_shard_wall_clock_s: float | None = Field(None, gt=0, le=30 * 24 * 3600)
    notify: NotifySpec | None = None  # whom to tell about each drop's job (upwell.after.notify)

    _known_payload = field_validator("payload")(Manifest._known_payload.__func__)

    @field_validator("delimiter")
    @classmethod
    def _one_delimiter(cls, v: str) -> str:
        if v in ('"', "\n", "\r") or not v.isascii():
            raise ValueError(f"delimiter {v!r} cannot separate fields: use one ASCII character other than a quote "
                             "or a line end")
        return v

    def matches(self, name: str) -> bool:
        return fnmatch.fnmatchcase(name, self.match)


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The pydantic model that holds the field at ``loc`` (nested models followed; None past a dict)."""
    for part in loc[:-1]:
        info = model.model_fields.get(part) if isinstance(part, str) else None
        nested = getattr(info, "annotation", None)
        if not (isinstance(nested, type) and issubclass(nested, BaseModel)):
            return None
        model = nested
    return model


def hint(model: type[BaseModel] | None, err: dict) -> str:
    """'; did you mean budget_usd?' for a misspelt field (an unknown key close to a known one), else ''."""
    if err.get("type") != "extra_forbidden" or model is None or not err.get("loc"):
        return ""
    return payload_params.did_you_mean(str(err["loc"][-1]), list(model.model_fields))


def validate(model: type[BaseModel], doc: dict, source: str, payloads: list[str] | None = None):
    """``payloads``: the registered definitions' names (built-ins only when None)."""
    try:
        return model.model_validate(doc, context={"payloads": payloads})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = _loc(err["loc"]) or "document"
        more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        tip = hint(_model_at(model, err["loc"]), err)
        raise InputRejected(f"{source}: {where}: {err['msg']}{tip}{more}", field=where, source=source) from None


def load_manifest(data: bytes, source: str, payloads: list[str] | None = None) -> Manifest:
    return validate(Manifest, parse_document(data, source), source, payloads)


def load_rule(data: bytes, source: str, payloads: list[str] | None = None) -> PipelineRule:
    return validate(PipelineRule, parse_document(data, source), source, payloads)


def manifest_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def grid_size(grid: dict[str, list[Any]]) -> int:
    return math.prod(len(v) for v in grid.values()) if grid else 1


def grid_points(m: Manifest, max_shards: int, max_param_bytes: int, definition=None) -> list[dict[str, Any]]:
    """Expand the grid into parameter points, one per shard, each validated against the payload's
    definition (a built-in one when ``definition`` is None)."""
    check_grid_size(m, max_shards)
    return list(iter_points(m, max_param_bytes, definition or Registry().resolve(m.payload).definition))


def check_grid_size(m: Manifest, max_shards: int) -> int:
    """The grid's point count, from its dimensions alone; InputRejected past ``max_shards``."""
    n = grid_size(m.grid)
    if n > max_shards:
        raise InputRejected(f"grid has {n} points; the limit is {max_shards} shards per job",
                            field="grid", limit=f"max_shards={max_shards}")
    return n


def iter_points(m: Manifest, max_param_bytes: int, definition) -> Iterator[dict[str, Any]]:
    """The grid's points in order, made and validated one at a time as the caller iterates (a sweep of
    100,000 points is never a list): the same errors as ``grid_points``, naming the point's row."""
    keys = list(m.grid)
    for i, combo in enumerate(itertools.product(*(m.grid[k] for k in keys))):
        point = {**m.params, **dict(zip(keys, combo, strict=True))}
        try:
            payload_params.validate(definition, point)
        except InputRejected as exc:
            field = exc.field.split(".", 1)[1]
            raise InputRejected(f"grid point {i} {json.dumps(point, default=str)[:200]}: {exc.message}",
                                field=f"grid.{field}" if field in keys else f"params.{field}", row=i) from None
        size = len(json.dumps(point, default=str))
        if size > max_param_bytes:
            raise InputRejected(f"grid point {i} parameters are {size} bytes; the limit is {max_param_bytes}",
                                field="params", row=i, limit=f"max_param_bytes={max_param_bytes}")
        yield point
