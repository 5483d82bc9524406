"""An instrument drop of 100 MB and of 1 GB: ingest against a plain download of the same blob, peak memory,
and the bytes ingest writes for each byte of input (issue 24, item 2).

For each size a CSV is generated in a temporary folder (never kept), uploaded to a fresh Azurite, and matched
by a pipeline rule (4 typed float columns, 100,000-row shards). A child process per size (so each has its own
peak RSS) then, ``--repeat`` times in turn: downloads the blob plainly (the same SDK download, chunks thrown
away), and ingests a fresh upload of it (validate, shard, ledger rows, work items). Figures:

- ingest ÷ plain download: the best seconds of each (goal ≥ 0.9); the CPU seconds of each are recorded too
  (``cpu_s``), which a busy machine disturbs less than the wall clock;
- peak RSS of the child, 1 GB ÷ 100 MB (goal ≤ 1.2), and its rise over the RSS before the first ingest;
- bytes written by ingest ÷ input: every request body the ingest sent (blobs, table rows, queue messages)
  over the blob's size (goal ≤ 0.01).

    .venv/bin/python bench/bench_drop.py [--sizes 100,1000] [--repeat 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from upwell import names  # noqa: E402
from upwell.storage import Storage  # noqa: E402

RULE = (b"match: 'benchdrop/*.csv'\npayload: channel-stats\n"
        b"columns: {time: float, heave: float, pitch: float, roll: float}\nshard: {rows: 100000}\n")


def generate(path: Path, mb: int) -> int:
    """A CSV of about ``mb`` MB at ``path``, written block by block; its size in bytes."""
    blocks = []
    for b in range(8):
        rows = [f"{(b * 20000 + i) * 0.05:.2f},{(i % 97) * 0.013:.5f},{(i % 31) * 0.021:.5f},{(i % 13) * 0.07:.5f}"
                for i in range(20000)]
        blocks.append(("\n".join(rows) + "\n").encode())
    size = 0
    with open(path, "wb") as fh:
        fh.write(b"time,heave,pitch,roll\n")
        while size < mb * 1_000_000:
            block = blocks[(size // len(blocks[0])) % len(blocks)]
            fh.write(block)
            size += len(block)
    return path.stat().st_size


class BodyMeter:
    """Counts the request bodies this process sends to storage (PUT, POST, PATCH, MERGE, DELETE), in bytes."""

    def __init__(self) -> None:
        self.bytes = 0
        self.requests = 0

    def __enter__(self) -> BodyMeter:
        from requests.adapters import HTTPAdapter

        self._send, meter = HTTPAdapter.send, self

        def send(adapter, request, *args, **kwargs):
            if request.method != "GET" and request.method != "HEAD":
                body = request.body
                meter.bytes += len(body) if isinstance(body, bytes | str) else 0
                meter.requests += 1
            return meter._send(adapter, request, *args, **kwargs)

        HTTPAdapter.send = send
        return self

    def __exit__(self, *exc) -> None:
        from requests.adapters import HTTPAdapter

        HTTPAdapter.send = self._send


def child(conn: str, source: Path, repeat: int) -> dict:
    """In its own process: plain download and ingest, in turn, ``repeat`` times; the figures."""
    from upwell.ingest.ingestor import Ingestor
    from upwell.settings import Settings

    store = Storage(conn)
    ingestor = Ingestor(store, Settings())
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    plain, ingest, written, shards, cpu = [], [], [], 0, {"plain": [], "ingest": []}
    for r in range(repeat):
        name = f"benchdrop/{source.stem}-{r}-{time.time_ns()}.csv"
        with open(source, "rb") as fh:
            store.blob(names.INCOMING, name).upload_blob(fh, max_concurrency=4)
        t, c = time.perf_counter(), time.process_time()
        size = sum(len(c) for c in store.chunks(f"{names.INCOMING}/{name}"))
        plain.append(time.perf_counter() - t)
        cpu["plain"].append(time.process_time() - c)
        with BodyMeter() as meter:
            t, c = time.perf_counter(), time.process_time()
            out = ingestor.ingest(name)
            ingest.append(time.perf_counter() - t)
            cpu["ingest"].append(time.process_time() - c)
        if out.status != "accepted":
            raise SystemExit(f"ingest of {name}: {out.status}: {out.message}")
        written.append(meter.bytes)
        shards = out.shards
    return {"bytes": size, "plain_s": plain, "ingest_s": ingest, "written_bytes": written, "shards": shards,
            "cpu_s": cpu,
            "rss_before_kb": rss_before, "rss_peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}


def run_size(conn: str, folder: Path, mb: int, repeat: int) -> dict:
    source = folder / f"drop-{mb}mb.csv"
    generate(source, mb)
    try:
        done = subprocess.run([sys.executable, __file__, "--child", conn, str(source), str(repeat)], check=True,
                              capture_output=True, text=True, cwd=HERE.parent,
                              env={**os.environ, "PYTHONPATH": str(HERE.parent)})
    finally:
        source.unlink()
    f = json.loads(done.stdout.strip().splitlines()[-1])
    f.update(mb=mb, ratio=min(f["plain_s"]) / min(f["ingest_s"]), written_ratio=max(f["written_bytes"]) / f["bytes"])
    return f


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]))))
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="100,1000", help="drop sizes in MB, the small one first")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    from upwell.local import azurite

    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="upwell-bench-drop-") as tmp, \
            azurite.start_on_free_ports(Path(tmp) / "azurite") as az:
        store = Storage(az.connection_string)
        store.ensure()
        store.write(f"{names.PIPELINES}/benchdrop.yaml", RULE)
        runs = [run_size(az.connection_string, Path(tmp), mb, args.repeat) for mb in sizes]
    for f in runs:
        each = ", ".join(f"{s:.2f}" for s in f["ingest_s"])
        print(f"drop {f['mb']:>5} MB  ingest {min(f['ingest_s']):6.2f} s (runs {each})"
              f"  plain download {min(f['plain_s']):6.2f} s  ratio {f['ratio']:.3f}  peak RSS "
              f"{f['rss_peak_kb'] / 1024:.0f} MB (+{(f['rss_peak_kb'] - f['rss_before_kb']) / 1024:.0f})  "
              f"written {max(f['written_bytes']):,} B ({f['written_ratio']:.5f} of input), {f['shards']} shards")
    rss = runs[-1]["rss_peak_kb"] / runs[0]["rss_peak_kb"]
    print(f"peak RSS {runs[-1]['mb']} MB ÷ {runs[0]['mb']} MB: {rss:.3f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"runs": runs, "rss_ratio": rss}, indent=1))


if __name__ == "__main__":
    main()
