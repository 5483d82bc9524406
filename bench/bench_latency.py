"""Upload -> first payload started, end to end through the local host (Azurite, the devhost, the local pool).

Each of ``--uploads`` one-point logistic manifests is uploaded to incoming/ and timed until its shard row
says the agent started it (``first_started_at``: the agent has the message, the ledger row is running and
the payload process is launched next). Uploads go one after another, ``--gap`` seconds apart, so the pool
is as warm as the previous upload left it. ``--cold`` uploads find the pool cold, with no worker process
(the scaler starts one): the first, and each after the scaler has taken the pool back to zero on its own (its
cooldown without backlog, then scale-in: ``wait_cold``); they are reported apart from the rest, as their mean.
Their times fall around two values here (about 0.6 s and 0.85 s), so a median of nine flipped between them
(0.69 s and 0.82 s in two runs) where the mean moved by 4%. Stopping the workers instead does not make a cold
pool: within its cooldown the scaler keeps a node warm and starts one again, so some such "cold" uploads met a
worker already up (0.34 s).

    .venv/bin/python bench/bench_latency.py [--uploads 20] [--gap 1.0] [--cold 9] [--json bench/out/latency.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from upwell import names
from upwell.ingest.blobnames import job_id_for
from upwell.ledger import Ledger
from upwell.local import azurite
from upwell.local.stack import LocalStack


def _ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def one(stack: LocalStack, ledger: Ledger, k: int, timeout: float = 60.0) -> dict[str, float]:
    """Seconds from the upload to: ingest starting (the job row), work enqueued (accepted), the shard started."""
    store = stack.storage
    name = f"latency/{time.time_ns()}-{k}/job.yaml"
    t0 = time.time()
    etag = store.blob(names.INCOMING, name).upload_blob(
        b"payload: logistic\nparams: {steps: 50, burn_in: 10}\ngrid: {r: [3.3]}\n")["etag"]
    job = job_id_for(name, etag)
    while time.time() - t0 < timeout:
        for row in ledger.shards(job):
            j = ledger.job(job) if row.first_started_at else None
            # The job row is written before its work items are sent and marked accepted after: on a busy
            # machine the agent can start the shard first, so wait for both times.
            if j is not None and j.accepted_at:
                return {"ingest_started": _ts(j.created_at) - t0, "enqueued": _ts(j.accepted_at) - t0,
                        "started": _ts(row.first_started_at) - t0}
        time.sleep(0.02)
    raise SystemExit(f"upload {k}: no shard started within {timeout} s (see the devhost log)")


def wait_cold(stack: LocalStack, timeout: float = 120.0) -> float:
    """Wait until the cpu pool has no worker process (the scaler took it to zero); the seconds waited."""
    from upwell.pools.process import LocalPool
    from upwell.settings import Settings

    pool = LocalPool(Settings.from_env(stack.env).pools["cpu"], stack.root / "pools")
    started = time.monotonic()
    while pool.status().nodes:
        if time.monotonic() - started > timeout:
            raise SystemExit(f"the cpu pool still has workers after {timeout:.0f} s: {pool.status().nodes}")
        time.sleep(0.25)
    return time.monotonic() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uploads", type=int, default=20)
    ap.add_argument("--gap", type=float, default=1.0, help="seconds between one shard starting and the next upload")
    ap.add_argument("--cold", type=int, default=9,
                    help="uploads to a cold pool (the first, then each once the scaler has taken it to zero)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="upwell-latency-"))
    ports = tuple(azurite.free_ports(3))
    [http] = azurite.free_ports(1)
    stack = LocalStack(root, ports=ports, http_port=http, quiet=True,
                       env={**os.environ, "UPWELL_LOG_LEVEL": "error"})
    with stack:
        ledger = Ledger(stack.storage)
        colds = [one(stack, ledger, 0, timeout=120.0)]
        for k in range(1, args.cold):
            wait_cold(stack)
            colds.append(one(stack, ledger, 1000 + k, timeout=120.0))
        steps = []
        for k in range(1, args.uploads + 1):
            time.sleep(args.gap)
            steps.append(one(stack, ledger, k))
    warm = [x["started"] for x in steps]
    s = sorted(warm)
    parts = {k: statistics.median(x[k] for x in steps) for k in ("ingest_started", "enqueued", "started")}
    cold = {k: statistics.mean(x[k] for x in colds) for k in ("ingest_started", "enqueued", "started")}
    cold_s = [x["started"] for x in colds]
    print(f"cold pool  {len(colds)} uploads: mean {cold['started']:.2f} s, median {statistics.median(cold_s):.2f} s "
          f"({', '.join(f'{x:.2f}' for x in cold_s)})")
    print(f"warm pool  {len(warm)} uploads: median {statistics.median(warm):.2f} s, "
          f"p90 {s[int(0.9 * (len(s) - 1))]:.2f} s, min {s[0]:.2f} s, max {s[-1]:.2f} s")
    waited = parts["started"] - parts["enqueued"]
    print(f"where      (medians) blob event to ingest start {parts['ingest_started']:.2f} s, ingest "
          f"{parts['enqueued'] - parts['ingest_started']:.2f} s, enqueued to started {waited:.2f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"cold_s": cold["started"], "cold": cold, "cold_runs_s": cold_s,
                                         "upload_to_start_s": warm,
                                         "steps": steps, "medians": parts, "gap_s": args.gap}, indent=1))


if __name__ == "__main__":
    main()
