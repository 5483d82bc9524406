"""One malloc arena for the process, so an ingest's peak memory does not depend on its threads' timing.

The CSV reader moves a drop through blocks of a few MiB (the download's chunks, the joined block, numpy's
line ends), made and freed on several threads: the download's, the reader's, the typed checker's. glibc's
malloc gives each thread that allocates an arena of its own (up to eight per core), and a block freed in one
arena serves only the threads of that arena. How much each arena keeps then depends on the order in which
the threads happened to allocate and free: the same 100 MB ingest peaked at +200 to +270 MB over the
process's start, and in one `make bench` a 300 MB ingest peaked at 371 MB against 277 MB for the 100 MB one
(bench/README.md, "Peak memory of an ingest").

With one arena (``mallopt(M_ARENA_MAX, 1)``), a block freed by any thread serves the next one: the same
ingests peak at +155 to +160 MB at 100 MB, 300 MB and 1 GB alike, in the same time. The threads take
turns on the arena's lock, which costs nothing measurable here: the blocks are few and large, Python
allocates under the GIL anyway, and Arrow's own buffers come from its own pool (mimalloc), not from malloc.
Mapping every block of 1 MiB or more on its own (``M_MMAP_THRESHOLD``) bounded the peak too (+132 MB) but
made a 1 GB ingest about 25% slower, in page faults.

The setting is the whole process's, and arenas that threads already hold stay theirs: it is made when the
process's first ``Ingestor`` is built, before any read of a drop. A C library other than glibc (no
``mallopt``, or one that ignores it) is left as it is.
"""

from __future__ import annotations

import ctypes
import functools

M_ARENA_MAX = -8  # glibc's malloc.h


@functools.cache
def one_arena() -> bool:
    """Have this process's threads share one malloc arena from now on (cached: later calls return the first
    answer; calls that race the first make the same setting again, which changes nothing): whether the C
    library took the setting."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt(M_ARENA_MAX, 1) == 1
