"""Per-channel count, mean, std (population), min and max over a CSV shard, streamed.

The CSV has a header; ``time_column`` (if present) is skipped, every other column
is a channel of numbers. Empty cells and non-finite values are counted as
``missing``. Blocks are combined with Chan's pairwise update, so the statistics
of several shards pool exactly (see ``upwell.results.figures.channel_stats``).
Metrics: rows, channels (names), stats {channel: {count, mean, std, min, max, missing}}.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from upwell.payloads.models import ChannelStatsParams
from workers.payloads.common import EXIT_OK, BadInput, Context, run_main, write_metrics

BLOCK_BYTES = 4 << 20


@dataclass
class Running:
    """Count, mean, sum of squared deviations, extremes and missing values of one channel."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0
    lo: float = math.inf
    hi: float = -math.inf
    missing: int = 0

    def add(self, values: np.ndarray) -> None:
        finite = values[np.isfinite(values)]
        self.missing += values.size - finite.size
        n = finite.size
        if n == 0:
            return
        mean = float(finite.mean())
        m2 = float(((finite - mean) ** 2).sum())
        total = self.count + n
        delta = mean - self.mean
        self.mean += delta * n / total
        self.m2 += m2 + delta * delta * self.count * n / total
        self.count = total
        self.lo = min(self.lo, float(finite.min()))
        self.hi = max(self.hi, float(finite.max()))

    def as_dict(self) -> dict:
        empty = self.count == 0
        return {"count": self.count, "mean": None if empty else self.mean,
                "std": None if empty else math.sqrt(self.m2 / self.count),
                "min": None if empty else self.lo, "max": None if empty else self.hi, "missing": self.missing}


def header(path: Path) -> list[str]:
    with open(path, newline="") as handle:
        row = next(csv.reader(handle), None)
    if not row:
        raise BadInput(f"{path.name} has no header row")
    return [name.strip() for name in row]


def stream_columns(path: Path, channels: list[str]):
    """Yield {channel: float64 array} per block; a non-number raises BadInput naming the column."""
    import pyarrow as pa
    from pyarrow import csv as pacsv

    convert = pacsv.ConvertOptions(column_types={c: pa.float64() for c in channels}, include_columns=channels,
                                   strings_can_be_null=True)
    try:
        reader = pacsv.open_csv(path, read_options=pacsv.ReadOptions(block_size=BLOCK_BYTES),
                                convert_options=convert)
        for batch in reader:
            yield {name: batch.column(i).to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
                   for i, name in enumerate(batch.schema.names)}
    except pa.ArrowInvalid as exc:
        raise BadInput(f"{path.name}: {exc}") from None


def channel_stats(path: Path, time_column: str) -> tuple[int, dict[str, Running]]:
    channels = [c for c in header(path) if c != time_column]
    if not channels:
        raise BadInput(f"{path.name} has no channel columns besides {time_column!r}")
    stats = {c: Running() for c in channels}
    rows = 0
    for block in stream_columns(path, channels):
        rows += len(next(iter(block.values())))
        for name, values in block.items():
            stats[name].add(values)
    return rows, stats


def main(ctx: Context) -> int:
    p = ChannelStatsParams(**ctx.params)
    rows, stats = channel_stats(ctx.require_input(), p.time_column)
    write_metrics(ctx, {"rows": rows, "channels": list(stats),
                        "stats": {name: s.as_dict() for name, s in stats.items()}})
    return EXIT_OK


if __name__ == "__main__":
    run_main(main)
