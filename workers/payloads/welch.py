"""Welch power spectral density per channel of a CSV shard (scipy.signal.welch).

Writes ``out/psd.npz``: freqs (nf,), psd (channels, nf), n_segments (channels,),
channels (names), fs, nperseg, noverlap. Shards are combined by a mean weighted
by segment count (``upwell.results.figures.welch.aggregate``); that equals Welch on the
whole file exactly when consecutive shards overlap by ``nperseg - step`` rows
and start on multiples of ``step = nperseg - noverlap`` (see the README).
A shard shorter than ``nperseg`` has no segments and weight 0.
Metrics: rows, channels, fs, nperseg, noverlap, n_segments, peak_frequency and
total_power per channel.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from upwell.payloads.models import WelchParams
from workers.payloads.channel_stats import header
from workers.payloads.common import EXIT_OK, BadInput, Context, atomic_write, run_main, write_metrics


def read_channels(path: Path, time_column: str) -> tuple[list[str], np.ndarray]:
    """Channel names and a (channels, rows) float64 array; a gap or non-number is BadInput."""
    import pyarrow as pa
    from pyarrow import csv as pacsv

    names = [c for c in header(path) if c != time_column]
    if not names:
        raise BadInput(f"{path.name} has no channel columns besides {time_column!r}")
    convert = pacsv.ConvertOptions(column_types={c: pa.float64() for c in names}, include_columns=names)
    try:
        table = pacsv.read_csv(path, convert_options=convert)
    except pa.ArrowInvalid as exc:
        raise BadInput(f"{path.name}: {exc}") from None
    data = np.vstack([table.column(c).to_numpy(zero_copy_only=False) for c in names]).astype(np.float64)
    bad = ~np.isfinite(data)
    if bad.any():
        channel, row = (int(i[0]) for i in np.nonzero(bad))
        raise BadInput(f"{path.name}: channel {names[channel]!r} has a gap or non-finite value at data row {row + 1}")
    return names, data


def spectrum(data: np.ndarray, fs: float, nperseg: int, noverlap: int) -> tuple[np.ndarray, np.ndarray, int]:
    """freqs, psd (channels, nf) and the number of segments averaged (0 for a short shard)."""
    from scipy.signal import welch

    rows = data.shape[1]
    nf = nperseg // 2 + 1
    freqs = np.fft.rfftfreq(nperseg, d=1.0 / fs)
    if rows < nperseg:
        return freqs, np.zeros((data.shape[0], nf)), 0
    freqs, psd = welch(data, fs=fs, window="hann", nperseg=nperseg, noverlap=noverlap, detrend="constant",
                       scaling="density", average="mean", axis=-1)
    return freqs, np.atleast_2d(psd), (rows - nperseg) // (nperseg - noverlap) + 1


def main(ctx: Context) -> int:
    p = WelchParams(**ctx.params)
    noverlap = p.nperseg // 2 if p.noverlap is None else p.noverlap
    names, data = read_channels(ctx.require_input(), p.time_column)
    freqs, psd, segments = spectrum(data, p.fs, p.nperseg, noverlap)
    n_segments = np.full(len(names), segments, dtype=np.int64)

    def write(handle) -> None:
        np.savez(handle, freqs=freqs, psd=psd, n_segments=n_segments, channels=np.array(names),
                 fs=p.fs, nperseg=p.nperseg, noverlap=noverlap)

    atomic_write(ctx.out_dir / "psd.npz", write)
    df = freqs[1] - freqs[0]
    write_metrics(ctx, {
        "rows": int(data.shape[1]), "channels": names, "fs": p.fs, "nperseg": p.nperseg, "noverlap": noverlap,
        "n_segments": segments,
        "peak_frequency": {n: float(freqs[int(np.argmax(psd[i, 1:])) + 1]) if segments else None
                           for i, n in enumerate(names)},
        "total_power": {n: float(psd[i].sum() * df) if segments else None for i, n in enumerate(names)}})
    return EXIT_OK


if __name__ == "__main__":
    run_main(main)
