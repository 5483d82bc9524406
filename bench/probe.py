"""The machine's own steadiness: three fixed measures that ``run_all.py`` takes before each bench run.

A bench row that two runs should repeat within 5% can do so only while the machine itself holds still. On a
shared VM it does not: its host's other tenants take vCPU time, memory bandwidth and the last-level cache in
phases of tens of seconds to minutes (bench/README.md). So each bench run is preceded by a probe of the machine
alone, and the table shows how far each probe measure moved over the whole ``make bench``: a bench row over 5%
beside a probe over 5% moved with the machine.

- ``python``: a fixed pure-Python loop, loops per second (one core's speed as the interpreter sees it: its
  share of a vCPU, the clock, the host's steal);
- ``start``: a fresh interpreter that imports numpy and exits, seconds (fork, exec, imports from the page
  cache: what every worker and payload start pays);
- ``copy``: ``np.copyto`` between two 256 MiB arrays, GB/s counting the bytes read and written (memory
  bandwidth, beyond the 480 MiB last-level cache this VM shares with the host's other tenants only in part).

Each is the median of ``SAMPLES`` samples on the wall clock, as the benches' own wall-clock samples see the
machine. The probe takes about 2 s.

    .venv/bin/python bench/probe.py        # one probe, as JSON
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np

SAMPLES = 5
LOOP = 300_000  # iterations of the pure-Python loop: about 20 ms
COPY_BYTES = 256 << 20  # each array


def _loop() -> int:
    total = 0
    for i in range(LOOP):
        total += i & 7
    return total


def _start() -> None:
    subprocess.run([sys.executable, "-c", "import numpy"], check=True)


def _median_s(fn: Callable[[], object], samples: int = SAMPLES) -> float:
    """The median wall-clock seconds of ``samples`` calls of ``fn``, after one untimed call."""
    fn()
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def probe() -> dict[str, float]:
    """One probe: ``python`` loops/s, ``start`` seconds, ``copy`` GB/s. The copy's arrays live for this call
    alone (the untimed first copy faults their pages in), so the caller does not hold 512 MiB between probes."""
    src, dst = np.ones(COPY_BYTES // 8), np.empty(COPY_BYTES // 8)
    return {"python": 1.0 / _median_s(_loop), "start": _median_s(_start),
            "copy": 2 * COPY_BYTES / _median_s(lambda: np.copyto(dst, src)) / 1e9}


# Each measure's name in the table and the format of its figure.
MEASURES = {"python": ("pure-Python loop", "{:.1f} loops/s"), "start": ("interpreter start (import numpy)", "{:.3f} s"),
            "copy": ("memory copy, 2 × 256 MiB", "{:.1f} GB/s")}


if __name__ == "__main__":
    print(json.dumps(probe()))
