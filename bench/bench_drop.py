"""An instrument drop of 100 MB and of 1 GB: ingest against a plain download of the same blob, peak memory,
and the bytes ingest writes for each byte of input (issue 24, item 2).

For each size a CSV is generated in a temporary folder (never kept), uploaded to a fresh Azurite, and matched
by a pipeline rule (4 typed float columns, 100,000-row shards). A child process per size (so each has its own
peak RSS) then, ``--repeat`` times in turn: downloads the blob plainly (the same SDK download, chunks thrown
away), and ingests a fresh upload of it (validate, shard, ledger rows, work items). Figures:

- ingest ÷ plain download (goal ≥ 0.9): each download is paired with the ingest that follows it, so both see
  the same load, and the ratio is the median of the pairs' ratios (the best seconds of each: ``best_ratio``).
  The ingest's time is split where its read of the drop ends (``ReadClock``): ``read_ratio`` is the plain
  download over the read alone (download, check, cut), ``tail_s`` what follows (the job's row, the shard rows,
  one work item a shard, the lease's finish).
  The CPU seconds of each are recorded too, this process's (``cpu_s``) and Azurite's (``azurite_cpu_s``): on
  a machine busy with other work the wall clock tends to the CPU seconds, so ``cpu_ratio`` (plain ÷ ingest,
  both processes counted) is what the wall-clock ratio becomes under full load; ``load`` is the 1-minute
  load average at each step. ``ceiling`` is the most the ratio could read on this machine's cores for the CPU
  this ingest spends (both processes; ``phases``): the read can take no less than its CPU seconds spread over
  every core, and what follows it no less than that too, nor less than Azurite's main thread spent on it (it
  serves requests one at a time), so plain ÷ (read CPU ÷ cores + that) bounds the ratio from above; the two
  phases cannot overlap, since no work item goes out before the whole drop is checked. Each step starts once
  Azurite is idle again (``settle``): after a 1 GB upload it works on for seconds, which would otherwise be
  billed to whichever step came next;
- peak RSS of the child, 1 GB ÷ 100 MB (goal ≤ 1.2), and its rise over the RSS before the first ingest;
- bytes written by ingest ÷ input: every request body the ingest sent (blobs, table rows, queue messages)
  over the blob's size (goal ≤ 0.01).

    .venv/bin/python bench/bench_drop.py [--sizes 100,1000] [--repeat 2] [--json out.json]
    .venv/bin/python bench/bench_drop.py --reader [--sizes 300] [--repeat 3]   # the CSV reader alone, no storage
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from upwell import names  # noqa: E402
from upwell.storage import CHUNK_GET_BYTES, Storage  # noqa: E402

COLUMNS = {"time": "float", "heave": "float", "pitch": "float", "roll": "float"}  # the columns ``generate`` writes
CORES = len(os.sched_getaffinity(0))
RULE = (b"match: 'benchdrop/*.csv'\npayload: channel-stats\n"
        b"columns: {" + ", ".join(f"{c}: {k}" for c, k in COLUMNS.items()).encode() + b"}\nshard: {rows: 100000}\n")


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


def tree_cpus(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) of process ``pid`` and its descendants, from /proc (Azurite's node), and of
    their main threads alone: for node, the one thread that runs its JavaScript, so a request's handling, one at
    a time (its libuv and GC threads left out). One walk of /proc for both."""
    parents, own, main = {}, {}, {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields, thread = (Path(stat).read_text().rsplit(")", 1)[1].split()
                              for stat in (f"/proc/{entry}/stat", f"/proc/{entry}/task/{entry}/stat"))
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(entry))
        own[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
        main[int(entry)] = (int(thread[11]) + int(thread[12])) / tick
    total, threads, todo = 0.0, 0.0, [pid]
    while todo:
        p = todo.pop()
        total, threads = total + own.get(p, 0.0), threads + main.get(p, 0.0)
        todo += parents.get(p, [])
    return total, threads


def tree_cpu(pid: int) -> float:
    """CPU seconds of process ``pid`` and its descendants (``tree_cpus``)."""
    return tree_cpus(pid)[0]


def settle(pid: int, quiet_s: float = 0.5, limit_s: float = 120.0) -> None:
    """Wait until Azurite has finished the work an upload leaves behind (it spent under 5% of a core over the
    last ``quiet_s``), so that it is not billed to the step measured next; at most ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        before = tree_cpu(pid)
        time.sleep(quiet_s)
        if tree_cpu(pid) - before < 0.05 * quiet_s:
            return


class ReadClock:
    """When an ingest's read of the drop ends (``InputSharder.instrument`` returns: every byte downloaded,
    checked and cut into shards); what follows is the job's record: its row, the shard rows, a work item a
    shard, the lease's finish."""

    def __init__(self, azurite_pid: int) -> None:
        from upwell.ingest.shardinputs import InputSharder

        self.ended, self.cpu, self.azurite, self.azurite_main = 0.0, 0.0, 0.0, 0.0
        real, clock = InputSharder.instrument, self

        def instrument(*args, **kwargs):
            try:
                return real(*args, **kwargs)
            finally:
                clock.ended = time.perf_counter()
                clock.cpu, (clock.azurite, clock.azurite_main) = time.process_time(), tree_cpus(azurite_pid)

        InputSharder.instrument = instrument


def child(conn: str, source: Path, repeat: int, azurite_pid: int) -> dict:
    """In its own process: plain download and ingest, in turn, ``repeat`` times; the figures."""
    from upwell.ingest.ingestor import Ingestor
    from upwell.settings import Settings

    read = ReadClock(azurite_pid)
    store = Storage(conn)
    ingestor = Ingestor(store, Settings())
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    plain, ingest, written, shards, cpu = [], [], [], 0, {"plain": [], "ingest": []}
    read_s, phases = [], []
    az, load = {"plain": [], "ingest": []}, []
    for r in range(repeat):
        name = f"benchdrop/{source.stem}-{r}-{time.time_ns()}.csv"
        with open(source, "rb") as fh:
            store.blob(names.INCOMING, name).upload_blob(fh, max_concurrency=4)
        settle(azurite_pid)
        load.append(os.getloadavg()[0])
        t, c, a = time.perf_counter(), time.process_time(), tree_cpu(azurite_pid)
        size = sum(len(c) for c in store.chunks(f"{names.INCOMING}/{name}"))
        plain.append(time.perf_counter() - t)
        cpu["plain"].append(time.process_time() - c)
        az["plain"].append(tree_cpu(azurite_pid) - a)
        settle(azurite_pid)
        with BodyMeter() as meter:
            t, c, a = time.perf_counter(), time.process_time(), tree_cpu(azurite_pid)
            out = ingestor.ingest(name)
            ingest.append(time.perf_counter() - t)
            cpu_end, (az_end, az_main_end) = time.process_time(), tree_cpus(azurite_pid)
            read_s.append(read.ended - t)
            cpu["ingest"].append(cpu_end - c)
            az["ingest"].append(az_end - a)
            phases.append({"read_cpu_s": read.cpu - c + read.azurite - a,
                           "tail_cpu_s": cpu_end - read.cpu + az_end - read.azurite,
                           "tail_azurite_main_s": az_main_end - read.azurite_main})
        load.append(os.getloadavg()[0])
        if out.status != "accepted":
            raise SystemExit(f"ingest of {name}: {out.status}: {out.message}")
        written.append(meter.bytes)
        shards = out.shards
    return {"bytes": size, "plain_s": plain, "ingest_s": ingest, "read_s": read_s, "phases": phases,
            "written_bytes": written,
            "shards": shards,
            "cpu_s": cpu, "azurite_cpu_s": az, "load": load,
            "rss_before_kb": rss_before, "rss_peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}


def run_size(conn: str, folder: Path, mb: int, repeat: int, azurite_pid: int) -> dict:
    source = folder / f"drop-{mb}mb.csv"
    generate(source, mb)
    try:
        done = subprocess.run([sys.executable, __file__, "--child", conn, str(source), str(repeat),
                               str(azurite_pid)], check=True,
                              capture_output=True, text=True, cwd=HERE.parent,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                  filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))})
    finally:
        source.unlink()
    f = json.loads(done.stdout.strip().splitlines()[-1])
    pairs = [p / i for p, i in zip(f["plain_s"], f["ingest_s"], strict=True)]
    cpu = [(f["cpu_s"][k][r] + f["azurite_cpu_s"][k][r] for k in ("plain", "ingest")) for r in range(repeat)]
    f.update(mb=mb, pair_ratios=pairs, ratio=statistics.median(pairs),
             best_ratio=min(f["plain_s"]) / min(f["ingest_s"]),
             read_ratio=statistics.median(p / r for p, r in zip(f["plain_s"], f["read_s"], strict=True)),
             tail_s=statistics.median(i - r for i, r in zip(f["ingest_s"], f["read_s"], strict=True)),
             cpu_ratio=statistics.median(p / i for p, i in cpu), written_ratio=max(f["written_bytes"]) / f["bytes"],
             cores=CORES, ceiling=statistics.median(
                 p / (ph["read_cpu_s"] / CORES + max(ph["tail_cpu_s"] / CORES, ph["tail_azurite_main_s"]))
                 for p, ph in zip(f["plain_s"], f["phases"], strict=True)))
    return f


def reader(path: Path, repeat: int) -> dict:
    """The CSV reader alone (``shard_csv`` as ingest calls it, on the file in download-sized chunks, no storage): wall,
    process CPU and its own thread's CPU seconds, against Arrow's typed parse of the same blocks run one after
    another (``csvblocks._typed_ok``, the library's part of the reader, which it overlaps with its own)."""
    from upwell.ingest import csvblocks
    from upwell.ingest.sharding import shard_csv

    data, chunk = path.read_bytes(), CHUNK_GET_BYTES
    layout = csvblocks.Layout(len(COLUMNS), b",", tuple((i, c, k) for i, (c, k) in enumerate(COLUMNS.items())), (),
                              path.name)
    blocks, pos = [], data.index(b"\n") + 1
    while pos < len(data):
        end = data.rfind(b"\n", pos, pos + chunk) + 1 or len(data)
        blocks.append(data[pos:end])
        pos = end
    out = {"bytes": len(data), "reader_s": [], "reader_cpu_s": [], "reader_thread_cpu_s": [], "arrow_s": []}
    for _ in range(repeat):
        t, c, th = time.perf_counter(), time.process_time(), time.thread_time()
        for _shard in shard_csv((data[i:i + chunk] for i in range(0, len(data), chunk)), source=path.name,
                                rows_per_shard=100_000, columns=COLUMNS, refs=True):
            pass
        out["reader_s"].append(time.perf_counter() - t)
        out["reader_cpu_s"].append(time.process_time() - c)
        out["reader_thread_cpu_s"].append(time.thread_time() - th)
        t = time.perf_counter()
        assert all(csvblocks._typed_ok(b, layout, 0) >= 0 for b in blocks)
        out["arrow_s"].append(time.perf_counter() - t)
    return out


def reader_only(sizes: list[int], repeat: int) -> None:
    """``--reader``: the reader's figures per GB at each size, and its wall clock ÷ Arrow's typed parse."""
    with tempfile.TemporaryDirectory(prefix="upwell-bench-reader-") as tmp:
        for mb in sizes:
            source = Path(tmp) / f"drop-{mb}mb.csv"
            generate(source, mb)
            f = reader(source, repeat)
            source.unlink()
            gb = f["bytes"] / 1e9
            per = [r / a for r, a in zip(f["reader_s"], f["arrow_s"], strict=True)]
            print(f"reader {mb:>5} MB  wall {min(f['reader_s']) / gb:.2f} s/GB  CPU {min(f['reader_cpu_s']) / gb:.2f}"
                  f" s/GB (its own thread {min(f['reader_thread_cpu_s']) / gb:.2f})  Arrow's typed parse alone "
                  f"{min(f['arrow_s']) / gb:.2f} s/GB  reader ÷ Arrow {statistics.median(per):.3f} "
                  f"(runs {', '.join(f'{x:.3f}' for x in per)})")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))))
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="100,1000", help="drop sizes in MB, the small one first")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--json", type=Path)
    p.add_argument("--reader", action="store_true", help="time the CSV reader alone, on a local file (no storage)")
    args = p.parse_args()
    if args.reader:
        reader_only([int(s) for s in args.sizes.split(",")], args.repeat)
        return
    from upwell.local import azurite

    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="upwell-bench-drop-") as tmp, \
            azurite.start_on_free_ports(Path(tmp) / "azurite") as az:
        store = Storage(az.connection_string)
        store.ensure()
        store.write(f"{names.PIPELINES}/benchdrop.yaml", RULE)
        runs = [run_size(az.connection_string, Path(tmp), mb, args.repeat, az.process.pid) for mb in sizes]
    for f in runs:
        each = ", ".join(f"{s:.2f}" for s in f["ingest_s"])
        pairs = ", ".join(f"{r:.2f}" for r in f["pair_ratios"])
        print(f"drop {f['mb']:>5} MB  ingest {min(f['ingest_s']):6.2f} s (runs {each})"
              f"  plain download {min(f['plain_s']):6.2f} s  ratio {f['ratio']:.3f} (pairs {pairs}; best "
              f"{f['best_ratio']:.3f}; CPU {f['cpu_ratio']:.3f}; load {min(f['load']):.1f}-{max(f['load']):.1f}; "
              f"the read alone {f['read_ratio']:.3f}, then {f['tail_s']:.2f} s to record and enqueue; ceiling on "
              f"{f['cores']} cores {f['ceiling']:.3f})"
              "  peak RSS "
              f"{f['rss_peak_kb'] / 1024:.0f} MB (+{(f['rss_peak_kb'] - f['rss_before_kb']) / 1024:.0f})  "
              f"written {max(f['written_bytes']):,} B ({f['written_ratio']:.5f} of input), {f['shards']} shards")
    rss = runs[-1]["rss_peak_kb"] / runs[0]["rss_peak_kb"]
    print(f"peak RSS {runs[-1]['mb']} MB ÷ {runs[0]['mb']} MB: {rss:.3f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"runs": runs, "rss_ratio": rss}, indent=1))


if __name__ == "__main__":
    main()
