"""The dated price table that ships with the code (``prices.json`` beside this module), and prices from it.

Prices are USD per node-hour. A *price key* names a row of the table: an Azure VM
size (``Standard_NC6s_v3``), ``local`` (free) or a notional row such as
``local-equivalent``. The table is loaded once into frozen dataclasses; pass a
``PriceTable`` explicitly to use another one (a refreshed file, a test table).

Worked examples (the DESIGN.md figures): 4 x Standard_NC6s_v3 x 24 h is about
$215; one Standard_D32s_v4 for 48 h is about $120.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from upwell.errors import ConfigError

DEFAULT_KEY = "local"


@dataclass(frozen=True)
class Price:
    """One row of the table. ``spot`` is None where the SKU has no spot offer."""

    key: str
    payg: float  # USD per node-hour, pay-as-you-go
    spot: float | None  # USD per node-hour on spot (indicative)
    kind: str = "vm"  # "vm" | "aci" | "local"
    region: str = ""
    vcpus: int = 0
    memory_gib: float = 0.0
    gpus: int = 0
    gpu_model: str = ""
    quota_family: str = ""  # e.g. "standardNCSv3Family": the scaler checks vCPU quota against it
    spot_quota_family: str = ""
    equivalent: str = ""  # an Azure key to compare with (for "local")
    alias_of: str = ""
    note: str = ""

    def per_hour(self, spot: bool = False) -> float:
        # No spot offer: charge PAYG, which overestimates rather than under.
        return self.spot if spot and self.spot is not None else self.payg

    @property
    def is_azure(self) -> bool:
        return self.kind != "local"


@dataclass(frozen=True)
class Services:
    aci_vcpu_second: float = 0.0
    aci_gb_second: float = 0.0
    blob_hot_gb_month: float = 0.0
    egress_free_gb_month: float = 0.0
    egress_per_gb: float = 0.0


@dataclass(frozen=True)
class PriceTable:
    """The whole table: ``as_of`` is the date its prices were taken."""

    as_of: str
    source: str
    currency: str = "USD"
    notes: tuple[str, ...] = ()
    prices: Mapping[str, Price] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    services: Services = Services()

    def get(self, key: str) -> Price:
        try:
            return self.prices[key]
        except KeyError:
            raise ConfigError(f"price key {key!r} is not in the price table of {self.as_of}; "
                              f"known: {sorted(self.prices)}") from None

    def __contains__(self, key: object) -> bool:
        return key in self.prices

    def azure_equivalent(self, key: str) -> Price | None:
        """The Azure row to compare a key with: itself, or its ``equivalent`` for local rows."""
        row = self.prices.get(key)
        if row is None:
            return None
        if row.is_azure:
            return row
        other = self.prices.get(row.equivalent)
        return other if other is not None and other.is_azure else None


def parse(data: Mapping[str, Any]) -> PriceTable:
    """Build a PriceTable from the JSON document (``schema`` 1); aliases resolved."""
    raw = dict(data.get("skus") or {})
    prices: dict[str, Price] = {}
    for key, row in raw.items():
        target = row.get("alias_of")
        if target:
            if target not in raw or raw[target].get("alias_of"):
                raise ConfigError(f"price key {key!r} aliases {target!r}, which is not a plain row")
            row = {**raw[target], "equivalent": "", **row}
        try:
            prices[key] = _price(key, row)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"price key {key!r}: {exc}") from None
    svc = data.get("services") or {}
    services = Services(
        aci_vcpu_second=float(svc.get("aci", {}).get("vcpu_second", 0.0)),
        aci_gb_second=float(svc.get("aci", {}).get("gb_second", 0.0)),
        blob_hot_gb_month=float(svc.get("blob_hot", {}).get("gb_month", 0.0)),
        egress_free_gb_month=float(svc.get("egress", {}).get("free_gb_month", 0.0)),
        egress_per_gb=float(svc.get("egress", {}).get("per_gb", 0.0)),
    )
    return PriceTable(as_of=str(data.get("as_of", "")), source=str(data.get("source", "")),
                      currency=str(data.get("currency", "USD")), notes=tuple(data.get("notes") or ()),
                      prices=MappingProxyType(prices), services=services)


def _price(key: str, row: Mapping[str, Any]) -> Price:
    spot = row.get("spot")
    payg = float(row["payg"])
    if payg < 0 or (spot is not None and float(spot) < 0):
        raise ValueError("prices must not be negative")
    return Price(key=key, payg=payg, spot=None if spot is None else float(spot),
                 kind=str(row.get("kind", "vm")), region=str(row.get("region", "")),
                 vcpus=int(row.get("vcpus", 0)), memory_gib=float(row.get("memory_gib", 0)),
                 gpus=int(row.get("gpus", 0)), gpu_model=str(row.get("gpu_model", "")),
                 quota_family=str(row.get("quota_family", "")),
                 spot_quota_family=str(row.get("spot_quota_family", "")),
                 equivalent=str(row.get("equivalent", "")), alias_of=str(row.get("alias_of", "")),
                 note=str(row.get("note", "")))


def default_path() -> Path:
    return Path(str(resources.files("upwell.cost").joinpath("prices.json")))


def load(path: str | Path | None = None) -> PriceTable:
    """Load a price table file; without a path, the one that ships with upwell (cached)."""
    if path is None:
        return _shipped()
    return parse(json.loads(Path(path).read_text(encoding="utf-8")))


@lru_cache(maxsize=1)
def _shipped() -> PriceTable:
    text = resources.files("upwell.cost").joinpath("prices.json").read_text(encoding="utf-8")
    return parse(json.loads(text))


def price(key: str, spot: bool = False, *, prices: PriceTable | None = None) -> float:
    """USD per node-hour for a price key, on spot or pay-as-you-go."""
    return (prices or load()).get(key).per_hour(spot)


def estimate(node_seconds: float, key: str, spot: bool = False, *, prices: PriceTable | None = None) -> float:
    """USD for ``node_seconds`` on ``key``."""
    return max(float(node_seconds), 0.0) / 3600.0 * price(key, spot, prices=prices)


def node_share(key: str, cpus: float = 1, gpus: float = 0, *, prices: PriceTable | None = None) -> float:
    """The share of a node one shard uses: its GPUs over the VM's, else its CPUs over the VM's (at most 1).

    A shard's cost is node-seconds x the VM's price x this share (Seqera's per-task formula), so
    shards that share a node are not each charged for all of it. Unknown keys and local rows: 1.
    """
    table = prices or load()
    row = table.prices.get(key)
    if row is None:
        return 1.0
    if gpus and row.gpus:
        return min(1.0, float(gpus) / row.gpus)
    if row.vcpus:
        return min(1.0, max(float(cpus), 1.0) / row.vcpus)
    return 1.0


def blended_per_hour(key: str, spot_fraction: float, *, prices: PriceTable | None = None) -> float:
    """USD per node-hour when ``spot_fraction`` of the nodes are spot (the pool's spot share)."""
    row = (prices or load()).get(key)
    f = min(max(float(spot_fraction), 0.0), 1.0)
    return (1.0 - f) * row.per_hour(False) + f * row.per_hour(True)
