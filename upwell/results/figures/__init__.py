"""Report sections per payload: a closed registry, resolved lazily.

Each module ``upwell.results.figures.<kind>`` exports ``sections(results, fetch)`` that
turns a job's result documents into report Sections. ``results`` are the parsed
``results/<job>/<shard>.json`` documents; ``fetch(blob_path)`` returns an
artifact's bytes (for example ``"results/<job>/<shard>/field.npz"``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Figure:
    caption: str
    png: bytes


@dataclass
class Table:
    caption: str
    columns: list[str]
    rows: list[list]


@dataclass
class Section:
    title: str
    text: str = ""
    figures: list[Figure] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)


Fetch = Callable[[str], bytes]
SectionsFn = Callable[[list[dict], Fetch], list[Section]]

FIGURES: dict[str, str] = {
    "logistic": "upwell.results.figures.logistic",
    "channel-stats": "upwell.results.figures.channel_stats",
    "welch": "upwell.results.figures.welch",
    "heat-mpi": "upwell.results.figures.heat",
    "train-torch": "upwell.results.figures.train",
}


def sections_for(payload: str) -> SectionsFn | None:
    """The sections function of a payload, or None when it has no figures module."""
    module = FIGURES.get(payload)
    if module is None:
        return None
    try:
        return importlib.import_module(module).sections
    except ModuleNotFoundError:
        return None
