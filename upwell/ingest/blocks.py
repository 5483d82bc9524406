"""Blocks of grid points: how many points one work item carries (``points_per_item``), and the limits a block
must fit.

Where a sweep's points are tiny (milliseconds), a work item per point spends far more on storage requests (the
message, its lease, the result and its trigger) than on the work. A manifest's ``points_per_item: k`` makes one
shard, one shard row and one work item per block of k consecutive grid points; the agent runs them in turn
(``workers.blocks``) and writes one result for the block, which the report expands into its points
(``upwell.results.points``). ``k = 1`` is a point per item, as before.

A block is compact: the shard row's ``params`` and the work item's ``params`` hold what every point shares (the
manifest's ``params``), and ``points`` holds each point's own grid values, in grid order. It must fit:
- a shard row's ``points`` property: a table String property holds at most 64 KiB (UTF-16, so 32 Ki characters;
  learn.microsoft.com/rest/api/storageservices/understanding-the-table-service-data-model, "Property types"),
  and ingest writes shard rows in entity-group transactions of 100 whose payload must stay under 4 MiB
  (learn.microsoft.com/azure/storage/tables/scalability-targets). ``POINTS_CHARS`` (16 Ki characters of ASCII
  JSON, 32 KiB as UTF-16) keeps 100 such rows under it;
- the work item: a queue message is at most 64 KiB (learn.microsoft.com/azure/storage/queues/
  scalability-targets), ``UPWELL_MAX_MESSAGE_BYTES``.
A block that does not fit is ``BlockTooLarge`` at submit, before any row or message exists, naming the largest
``points_per_item`` that would fit.

``auto`` picks k so that one item runs about ``UPWELL_BLOCK_TARGET_S`` by the manifest's estimate per point
(``estimate.node_seconds_per_shard``, which is per point), at most ``UPWELL_BLOCK_MAX`` and never more than the
grid has; then shrinks it, if needed, to what the first block's size says fits (grid points of one sweep are
alike in size; a later block that still does not fit is refused all the same).
"""

from __future__ import annotations

import json
import math
from typing import Any

from upwell.errors import BlockTooLarge

POINTS_CHARS = 16 * 1024  # a block's points as JSON, at most (see the module docstring)
HEADROOM = 0.9  # auto leaves this share of the limit for points a little longer than the first block's


def points_json(points: list[dict[str, Any]]) -> str:
    """A block's points as stored on its shard row (sorted keys, no spaces)."""
    return json.dumps(points, sort_keys=True, separators=(",", ":"), default=str)


def auto_size(per_point_s: float, target_s: float, cap: int, points: int) -> int:
    """k for ``auto``: ``target_s`` of estimated work per item, at least 1, at most ``cap`` and ``points``."""
    if per_point_s <= 0:
        return max(1, min(cap, points))
    return max(1, min(cap, points, math.floor(target_s / per_point_s)))


def fitting(sample: list[dict[str, Any]], limit: int = POINTS_CHARS) -> int:
    """The most points a block of points like ``sample`` holds within ``limit`` characters (at least 1)."""
    if not sample:
        return 1
    per = len(points_json(sample)) / len(sample)
    return max(1, math.floor(limit * HEADROOM / max(per, 1.0)))


def fitting_message(points: list[dict[str, Any]], size: int, limit: int) -> int:
    """The most points like these whose work item fits ``limit`` bytes, given one of ``size`` bytes for them."""
    text = len(points_json(points))
    return fitting(points, max(0, limit - (size - text)))


def check(shard_id: str, points: list[dict[str, Any]], limit: int = POINTS_CHARS) -> str:
    """The block's points JSON; BlockTooLarge naming the largest k that fits when it is over ``limit``."""
    text = points_json(points)
    if len(text) > limit:
        raise too_large(shard_id, f"its points are {len(text)} characters; a shard row holds {limit}",
                        fitting(points, limit), limit=f"points_chars={limit}")
    return text


def too_large(shard_id: str, why: str, fits: int, *, limit: str) -> BlockTooLarge:
    """The named error for a block that cannot be stored or sent."""
    return BlockTooLarge(f"block {shard_id} does not fit: {why}; use points_per_item: {fits} or less",
                         field="points_per_item", limit=limit)


def size_for(m, target_s: float, cap: int) -> tuple[int, bool]:
    """A manifest's (k, whether to fit k to the first block): its ``points_per_item``, or ``auto``'s choice."""
    from upwell.ingest.manifests import grid_size

    if m.points_per_item == "auto":
        return auto_size(m.estimate.node_seconds_per_shard, target_s, cap, grid_size(m.grid)), True
    return int(m.points_per_item), False
