"""Report section for Welch spectra: the shards' PSDs combined into one spectrum per channel.

``aggregate(psds)`` is the combination: a mean of the shards' PSDs weighted by
their segment counts. Welch's estimate is the mean of per-segment periodograms,
so when the shards' segments tile the file's segments (consecutive shards overlap
by ``nperseg - step`` rows, each starting on a multiple of ``step``) the result
equals ``scipy.signal.welch`` on the whole file to rounding. With disjoint shards
the segments that straddle a boundary are missing; see workers/payloads/README.md.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping

import numpy as np

from upwell.results.figures import Fetch, Section, Table
from upwell.results.figures._common import fetch_artifact, fmt, missing_note, new_figure, succeeded, to_png

MAX_CHANNELS_PLOTTED = 8


def aggregate(psds: Iterable[Mapping]) -> tuple[np.ndarray, np.ndarray]:
    """freqs and the segment-weighted mean PSD (channels, nf) of shards {freqs, psd, n_segments}.

    Shards with no segments carry no weight. Raises ValueError when the shards'
    frequency grids or channel counts differ, or when no shard has a segment.
    """
    freqs, total, weight = None, None, None
    for shard in psds:
        f, psd = np.asarray(shard["freqs"]), np.atleast_2d(np.asarray(shard["psd"], dtype=np.float64))
        n = np.broadcast_to(np.asarray(shard["n_segments"], dtype=np.float64), psd.shape[:1])
        if freqs is None:
            freqs, total, weight = f, np.zeros_like(psd), np.zeros(psd.shape[0])
        elif f.shape != freqs.shape or not np.allclose(f, freqs, rtol=1e-12) or psd.shape != total.shape:
            raise ValueError("shards have different frequency grids or channel counts; they cannot be combined")
        total += psd * n[:, None]
        weight += n
    if weight is None or not np.all(weight > 0):
        raise ValueError("no shard has a full segment; nothing to combine")
    return freqs, total / weight[:, None]


def load_shards(docs: list[dict], fetch: Fetch) -> tuple[list[dict], list[str]]:
    shards, channels = [], []
    for doc in docs:
        data = fetch_artifact(doc, "psd.npz", fetch)
        if data is None:
            continue
        with np.load(io.BytesIO(data)) as npz:
            shard = {k: np.array(npz[k]) for k in ("freqs", "psd", "n_segments")}
            if not channels and "channels" in npz.files:
                channels = [str(c) for c in npz["channels"]]
        shards.append(shard)
    return shards, channels


def sections(results: list[dict], fetch: Fetch) -> list[Section]:
    ok = succeeded(results)
    note = missing_note(results, ok)
    shards, channels = load_shards(ok, fetch)
    try:
        freqs, psd = aggregate(shards)
    except ValueError as exc:
        return [Section("Welch power spectrum", text=f"{exc}. {note}".strip())]
    channels = channels if len(channels) == psd.shape[0] else [f"ch{i}" for i in range(psd.shape[0])]
    fig, ax = new_figure(8, 4.5)
    for i, name in enumerate(channels[:MAX_CHANNELS_PLOTTED]):
        ax.semilogy(freqs[1:], psd[i, 1:], lw=0.9, label=name)
    ax.set(xlabel="frequency [Hz]", ylabel="PSD [unit²/Hz]", title="Welch PSD, all shards combined")
    ax.legend(fontsize="small", ncols=2)
    segments = int(sum(np.max(s["n_segments"]) for s in shards))
    df = freqs[1] - freqs[0] if len(freqs) > 1 else 1.0
    table = Table(caption="Per channel: peak frequency and total power of the combined spectrum",
                  columns=["channel", "peak frequency [Hz]", "total power", "segments"],
                  rows=[[name, fmt(freqs[1 + int(np.argmax(psd[i, 1:]))] if len(freqs) > 1 else None),
                         fmt(float(psd[i].sum() * df)), str(segments)] for i, name in enumerate(channels)])
    text = (f"{len(shards)} shards, {segments} segments combined by a segment-weighted mean; "
            f"resolution {fmt(df)} Hz. {note}").strip()
    return [Section("Welch power spectrum", text=text, tables=[table],
                    figures=[to_png(fig, "Combined power spectral density per channel")])]
