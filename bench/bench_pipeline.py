"""Pipeline throughput and ingest bandwidth, each as a ratio against a bare baseline in the same run.

1. work items/s through the pipeline (ingest -> queue -> agent -> result -> collect), against
   bare Azurite send + receive + delete round trips of the same number of messages;
2. ingest MB/s (validate + shard + write shards) against a plain download of the same blob.

Run: .venv/bin/python bench/bench_pipeline.py [--items 60] [--mb 16] [--slots 4] [--calls]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from upwell import names
from upwell.ingest.ingestor import Ingestor
from upwell.local import azurite
from upwell.results.collect import collect
from upwell.settings import Settings
from upwell.storage import Storage
from workers.agent import Agent, AgentConfig


def bare_queue(store: Storage, n: int) -> float:
    q = store.queue("bench-bare")
    q.create_queue() if not _exists(q) else q.clear_messages()
    t = time.perf_counter()
    for i in range(n):
        q.send_message(f'{{"i": {i}}}')
        m = q.receive_message(visibility_timeout=30)
        q.delete_message(m)
    return n / (time.perf_counter() - t)


def _exists(q) -> bool:
    try:
        q.get_queue_properties()
        return True
    except Exception:  # noqa: BLE001
        return False


class CallCounter:
    """Counts HTTP requests to storage made in this process (ingest, the agent, collect), by URL path kind."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.detail: dict[str, int] = {}  # "<phase> <METHOD> <kind> <what>", for --calls
        self.phase = ""

    def __enter__(self) -> CallCounter:
        from requests.adapters import HTTPAdapter

        self._send = HTTPAdapter.send
        counter = self

        def send(adapter, request, *args, **kwargs):
            path = request.url.split("?", 1)[0]
            kind = "queue" if "/messages" in path or "/work-" in path else (
                "table" if "/jobs" in path or "/Tables" in path or "$batch" in path else "blob")
            counter.calls[kind] = counter.calls.get(kind, 0) + 1
            key = f"{counter.phase} {request.method} {kind} {_what(request.url)}".strip()
            counter.detail[key] = counter.detail.get(key, 0) + 1
            return counter._send(adapter, request, *args, **kwargs)

        HTTPAdapter.send = send
        return self

    def __exit__(self, *exc) -> None:
        from requests.adapters import HTTPAdapter

        HTTPAdapter.send = self._send

    @property
    def total(self) -> int:
        return sum(self.calls.values())


def _what(url: str) -> str:
    """The operation a storage URL names, coarsely: entity, query, batch, list, messages, message, blob."""
    path, _, query = url.partition("?")
    if "$batch" in path:
        return "batch"
    if "PartitionKey=" in path:
        return "entity"
    if "$filter" in query:
        return "query"
    if "comp=list" in query:
        return "list"
    if re.search(r"/messages/[^/]+$", path):
        return "message"
    if path.endswith("/messages"):
        return "messages"
    return "other"


def pipeline(store: Storage, n: int, counter: CallCounter | None = None, slots: int = 1) -> float:
    grid = ", ".join(f"{3.0 + i / (10 * n):.6f}" for i in range(n))
    name = f"bench/{time.time_ns()}/job.yaml"
    store.blob(names.INCOMING, name).upload_blob(
        f"payload: logistic\nparams: {{steps: 50, burn_in: 10}}\ngrid: {{r: [{grid}]}}\n".encode())
    t = time.perf_counter()
    counter = counter or CallCounter()
    with counter:
        counter.phase = "ingest"
        out = Ingestor(store, Settings()).ingest(name)
        counter.phase = "agent"
        agent = Agent(store, AgentConfig(pool="cpu", node_id="bench", idle_exit_s=0.01, poll_s=0.01, slots=slots),
                      Settings())
        agent.run()
        counter.phase = "collect"
        for blob in list(store.list(names.RESULTS, f"{out.job_id}/")):
            if blob.name.count("/") == 1:
                collect(store, blob.name)
    elapsed = time.perf_counter() - t
    assert agent.processed == n, agent.processed
    return n / elapsed


def ingest_bandwidth(store: Storage, mb: int) -> tuple[float, float]:
    rows = io.StringIO()
    rows.write("time,heave,pitch,roll\n")
    i = 0
    while rows.tell() < mb * 1_000_000:
        rows.write(f"{i * 0.05:.2f},{(i % 97) * 0.013:.5f},{(i % 31) * 0.021:.5f},{(i % 13) * 0.07:.5f}\n")
        i += 1
    data = rows.getvalue().encode()
    store.write(f"{names.PIPELINES}/bench.yaml", b"match: 'benchdrop/*.csv'\npayload: channel-stats\n"
                b"columns: {time: float, heave: float, pitch: float, roll: float}\nshard: {rows: 50000}\n")
    name = f"benchdrop/{time.time_ns()}.csv"
    store.blob(names.INCOMING, name).upload_blob(data)
    t = time.perf_counter()
    store.read(f"{names.INCOMING}/{name}")
    plain = len(data) / (time.perf_counter() - t) / 1e6
    t = time.perf_counter()
    out = Ingestor(store, Settings(max_upload_bytes=1 << 34)).ingest(name)
    ingest = len(data) / (time.perf_counter() - t) / 1e6
    assert out.status == "accepted", out
    return ingest, plain


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--items", type=int, default=60)
    p.add_argument("--mb", type=int, default=16)
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument("--slots", type=int, default=1, help="work items the agent runs at once (a pool's tasks per node)")
    p.add_argument("--calls", action="store_true", help="also print the storage calls per item by stage and kind")
    p.add_argument("--cold", action="store_true", help="start each payload as a fresh interpreter (no warm runner)")
    args = p.parse_args()
    # As upwell up runs the local pool: Python payloads forked from the warm runner (workers/forkserver.py).
    os.environ["UPWELL_WARM_RUNNER"] = "0" if args.cold else "1"
    with azurite.start_on_free_ports(Path(tempfile.mkdtemp()), in_memory=True) as az:
        store = Storage(az.connection_string)
        store.ensure()
        base = bare_queue(store, args.items)
        counter = CallCounter()
        pipe = pipeline(store, args.items, counter, slots=args.slots)
        ing, plain = ingest_bandwidth(store, args.mb)
    print(f"pipeline  {pipe:8.2f} items/s  vs bare Azurite send+receive+delete {base:8.2f} msg/s  "
          f"ratio {pipe / base:.3f}")
    kinds = ", ".join(f"{k} {v / args.items:.1f}" for k, v in sorted(counter.calls.items()))
    print(f"storage   {counter.total / args.items:.1f} calls per item ({kinds})")
    if args.calls:
        for key, v in sorted(counter.detail.items()):
            print(f"          {v / args.items:5.2f}  {key}")
    print(f"ingest    {ing:8.2f} MB/s     vs plain blob read {plain:8.2f} MB/s  ratio {ing / plain:.3f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "pipeline": {"items": args.items, "warm_runner": not args.cold, "slots": args.slots, "items_per_s": pipe,
                         "bare_msg_per_s": base, "ratio": pipe / base,
                         "storage_calls_per_item": counter.total / args.items,
                         "storage_calls": counter.calls, "storage_calls_by_stage": counter.detail},
            "ingest": {"mb": args.mb, "mb_per_s": ing, "plain_mb_per_s": plain, "ratio": ing / plain}}, indent=1))


if __name__ == "__main__":
    main()
