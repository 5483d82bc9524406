"""upwell.ingest.heap: once the setting is made, threads share one malloc arena.

Each case runs in a fresh interpreter (the setting is process-wide and cannot be undone). Four threads, alive
at the same time, each allocate 4 MiB blocks; glibc's own report (``malloc_info``, one ``<heap nr=...>`` per
arena) then says how many arenas the process has."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import ctypes, os, re, sys, tempfile, threading
from upwell.ingest import heap

took = heap.one_arena() if sys.argv[1] == "set" else None
together = threading.Barrier(4)
kept = []

def work():
    blocks = [b"\\x01" * (4 << 20) for _ in range(3)]
    together.wait()
    kept.append(blocks[-1])

threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
with tempfile.NamedTemporaryFile(suffix=".xml") as out:
    fp = libc.fopen(out.name.encode(), b"w")
    libc.malloc_info(0, fp)
    libc.fclose(fp)
    report = open(out.name).read()
print(took, len(re.findall(r"<heap nr=", report)))
"""


def _arenas(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], cwd=ROOT, capture_output=True, text=True,
                         check=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}).stdout.split()
    return out[0], int(out[1])


def test_threads_get_arenas_of_their_own_without_the_setting():
    took, arenas = _arenas("leave")
    assert took == "None"
    assert arenas >= 3, f"{arenas} arenas for four threads that allocated at once: the case the setting is for"


def test_threads_share_one_arena_with_the_setting():
    took, arenas = _arenas("set")
    assert took == "True"
    assert arenas == 1


def test_later_calls_give_the_first_answer():
    """Cached: an Ingestor built per invocation asks again; calls that race the first may make the same
    setting again, which changes nothing (a whole test run's devhost ingests on several threads)."""
    from upwell.ingest import heap

    first = heap.one_arena()
    assert first is True  # glibc here
    assert heap.one_arena() is first
    assert heap.one_arena.cache_info().currsize == 1


def test_an_ingestor_makes_the_setting(monkeypatch):
    from upwell.ingest import heap, ingestor
    from upwell.settings import Settings
    from upwell.storage import Storage

    calls = []
    monkeypatch.setattr(heap, "one_arena", lambda: calls.append(1) or True)
    ingestor.Ingestor(Storage("UseDevelopmentStorage=true"), Settings())  # clients only: no request is made
    assert calls == [1]
