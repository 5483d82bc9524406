"""Pipeline throughput as a ratio against a bare baseline in interleaved pairs.

Work items/s through the pipeline (ingest -> queue -> agent -> result -> collect), against bare Azurite send +
receive + delete round trips. The bare loop and the pipeline alternate in ``--pairs`` pairs against the same
Azurite (``bench/pairs.py``), each bare sample at least ``--sample-s`` seconds of work (it sends as many
messages as fill it; a pipeline sample is ``--items`` work items), after an untimed warm-up of each; the ratio
is the median of the per-pair ratios.

Ingest against a plain download of the same blob is ``bench_drop.py``'s, at two sizes, each in a fresh process
and Azurite. It was measured here too, on a 16 MB CSV, until 2026-12-04: there the plain read takes 15-70 ms,
so the ratio weighed an ingest's fixed requests against Azurite's warming read path (the same configuration
read 0.193 and then 0.073 against one Azurite) and two runs of ``make bench`` disagreed by 9%
(bench/README.md).

Run: .venv/bin/python bench/bench_pipeline.py [--items 60] [--pairs 3] [--slots 4] [--calls]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.pairs import calibrate, interleave, pair_ratios
from upwell import names
from upwell.ingest.ingestor import Ingestor
from upwell.local import azurite
from upwell.results.collect import collect
from upwell.settings import Settings
from upwell.storage import Storage
from workers.agent import Agent, AgentConfig


def bare_queue(q, n: int) -> float:
    """msg/s of ``n`` send + receive + delete round trips on queue client ``q``."""
    t = time.perf_counter()
    for i in range(n):
        q.send_message(f'{{"i": {i}}}')
        m = q.receive_message(visibility_timeout=30)
        q.delete_message(m)
    return n / (time.perf_counter() - t)


def throughput(store: Storage, items: int, pairs: int, target_s: float, slots: int) -> dict:
    """Pipeline items/s ÷ bare msg/s, in interleaved pairs; the storage calls of every pipeline sample counted."""
    q = store.queue("bench-bare")
    q.create_queue() if not _exists(q) else q.clear_messages()
    bare_n = calibrate(lambda: bare_queue(q, 1), target_s)  # also the bare loop's warm-up
    pipeline(store, 2, slots=slots)  # untimed: the first ingest, agent and collect
    counter = CallCounter()
    bare, pipe = interleave(lambda: bare_queue(q, bare_n), lambda: pipeline(store, items, counter, slots), pairs)
    per = pair_ratios(pipe, bare)
    return {"items": items, "pairs": pairs, "bare_messages": bare_n, "slots": slots,
            "items_per_s": statistics.median(pipe), "bare_msg_per_s": statistics.median(bare),
            "ratio": statistics.median(per), "pair_ratios": per, "items_per_s_samples": pipe, "bare_samples": bare,
            "storage_calls_per_item": counter.total / (items * pairs), "storage_calls": counter.calls,
            "storage_calls_by_stage": counter.detail}


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
    """Items/s of one ``n``-point sweep through ingest, an agent in this process, and collect."""
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
        # The agent stops at n items. It is not told to leave when idle for 0.01 s: after each item it checks
        # its idle time once more, so a node-row refresh slower than that on a busy machine sent it away after
        # one or two items; 5 s is only the bound should an item never come.
        agent = Agent(store, AgentConfig(pool="cpu", node_id="bench", idle_exit_s=5.0, poll_s=0.01, slots=slots,
                                         max_items=n), Settings())
        agent.run()
        processed = agent.processed
        counter.phase = "collect"
        for blob in list(store.list(names.RESULTS, f"{out.job_id}/")):
            if blob.name.count("/") == 1:
                collect(store, blob.name)
    elapsed = time.perf_counter() - t
    assert processed == n, processed
    return n / elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--items", type=int, default=60)
    p.add_argument("--pairs", type=int, default=3, help="baseline/subject pairs; the median pair ratio is kept")
    p.add_argument("--sample-s", type=float, default=2.0, help="seconds of work in each baseline sample (at least)")
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
        pipe = throughput(store, args.items, args.pairs, args.sample_s, args.slots)
    print(f"pipeline  {pipe['items_per_s']:8.2f} items/s  vs bare Azurite send+receive+delete "
          f"{pipe['bare_msg_per_s']:8.2f} msg/s  ratio {pipe['ratio']:.3f}, median of pairs "
          + " ".join(f"{x:.3f}" for x in pipe["pair_ratios"]))
    kinds = ", ".join(f"{k} {v / (args.items * args.pairs):.1f}" for k, v in sorted(pipe["storage_calls"].items()))
    print(f"storage   {pipe['storage_calls_per_item']:.1f} calls per item ({kinds})")
    if args.calls:
        for key, v in sorted(pipe["storage_calls_by_stage"].items()):
            print(f"          {v / (args.items * args.pairs):5.2f}  {key}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"pipeline": {**pipe, "warm_runner": not args.cold}},
                                        indent=1))


if __name__ == "__main__":
    main()
