"""The cost of a reconciler pass over N uploads, as ratios against a bare listing of the same blobs.

Setup (not timed): N blobs in incoming/, each with its job row, so that a pass
finds nothing to do; that is the steady state the timer runs in every 5 min.
Timed, in the same run on the same Azurite:

* baseline: one bare ``list_blobs`` of incoming/;
* cold pass: no watermark yet: the listing plus one query of the job rows;
* warm pass: the watermark is past every blob: the listing, and nothing checked;
* naive: one ledger lookup per blob (what a pass without the batched query would do),
  measured on a sample and scaled to N.

Run: .venv/bin/python bench/bench_reconcile.py [--blobs 10000] [--threads 16]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from azure.core.exceptions import AzureError

from upwell import names
from upwell.ingest.ingestor import job_id_for
from upwell.ledger import Ledger
from upwell.local import azurite
from upwell.ops.reconcile import Reconciler
from upwell.settings import Settings
from upwell.storage import Storage


def setup(store: Storage, n: int, threads: int) -> list[str]:
    def one(i: int) -> str:
        for attempt in range(5):  # Azurite drops a connection now and then under this many writers
            try:
                name = f"bench/{i // 1000:03d}/drop-{i:06d}.csv"
                etag = store.blob(names.INCOMING, name).upload_blob(b"t,v\n0,1\n", overwrite=True)["etag"]
                job_id = job_id_for(name, etag)
                store.table(names.JOBS_TABLE).upsert_entity({"PartitionKey": job_id, "RowKey": names.JOB_ROW,
                                                             "status": "succeeded", "reported": True})
                return job_id
            except (AzureError, ConnectionError):
                time.sleep(0.5 * (attempt + 1))
        raise RuntimeError(f"setup of blob {i} failed 5 times")
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(one, range(n)))


def timed(fn) -> tuple[float, object]:
    t = time.perf_counter()
    value = fn()
    return time.perf_counter() - t, value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blobs", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=6)
    parser.add_argument("--sample", type=int, default=500, help="blobs for the naive per-blob lookup")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        emulator = azurite.start_on_free_ports(Path(tmp), in_memory=True)
        try:
            store = Storage(emulator.connection_string)
            store.ensure()
            t_setup, job_ids = timed(lambda: setup(store, args.blobs, args.threads))
            print(f"setup: {args.blobs} uploads with job rows in {t_setup:.1f} s")
            time.sleep(1.1)
            settings = dataclasses.replace(Settings(), reconcile_grace_s=0)
            t_list, listed = timed(lambda: sum(1 for _ in store.list(names.INCOMING)))
            t_cold, cold = timed(lambda: Reconciler(store, settings).run())
            t_warm, warm = timed(lambda: Reconciler(store, settings).run())
            ledger = Ledger(store)
            sample = job_ids[: args.sample]
            t_naive, _ = timed(lambda: [ledger.job(j) for j in sample])
            t_naive *= len(job_ids) / len(sample)
        finally:
            emulator.stop()
    assert listed == args.blobs and cold.actions == [] and warm.actions == [], (listed, cold.actions, warm.actions)
    assert cold.checked == args.blobs and warm.checked == 0
    print(f"baseline: bare listing of {listed} blobs: {t_list:.2f} s")
    print(f"cold pass (no watermark, one job-row query): {t_cold:.2f} s  ratio {t_cold / t_list:.2f}")
    print(f"warm pass (watermark past every blob):      {t_warm:.2f} s  ratio {t_warm / t_list:.2f}")
    print(f"naive per-blob ledger lookups (from {len(sample)}):  {t_naive:.2f} s  ratio {t_naive / t_list:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
