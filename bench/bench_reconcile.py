"""The cost of a reconciler pass over N uploads, as ratios against a bare listing of the same blobs.

Setup (not timed): N blobs in incoming/, each with its job row, so that a pass
finds nothing to do; that is the steady state the timer runs in every 5 min. The
blob change feed (Azurite has none) is written in Azure's documented layout by
tests/changefeed_writer.py: one BlobCreated record per upload, in earlier hourly
segments. Timed, in the same run on the same Azurite:

* baseline: one bare ``list_blobs`` of incoming/;
* cold pass (listing mode): no watermark yet: the listing plus one query of the job rows;
* warm pass (listing mode): the watermark is past every blob: the listing, and nothing checked;
* naive: one ledger lookup per blob (what a pass without the batched query would do),
  measured on a sample and scaled to N;
* change feed catch-up: a cursor at the first segment: every one of the N records read once;

then ``--new`` more uploads arrive (with their job rows and feed records) and, each
the median of ``--repeat`` runs from the same saved state, against a bare listing of
the N + new blobs measured then:

* listing mode: a whole pass, and its incoming/ step alone (lists N + new, checks new);
* changefeed mode: a whole pass, and its incoming/ step alone (reads new records, checks new);
* changefeed mode with nothing new since its last pass.

Run: .venv/bin/python bench/bench_reconcile.py [--blobs 10000] [--new 100] [--threads 6] [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from azure.core.exceptions import AzureError

from tests.changefeed_writer import FeedWriter, event
from upwell import names
from upwell.ingest.blobnames import job_id_for
from upwell.ledger import Ledger
from upwell.local import azurite
from upwell.ops.changefeed import CONTAINER, Cursor, segment_key
from upwell.ops.reconcile import Reconciler
from upwell.scalelog import ScalingLog
from upwell.settings import Settings
from upwell.storage import Storage

HOUR = dt.timedelta(hours=1)
PER_SEGMENT = 1000  # records per old hourly segment


def setup(store: Storage, first: int, n: int, threads: int) -> list[tuple[str, str, dt.datetime]]:
    """``n`` uploads with their job rows; (name, ETag, last modified) of each."""

    def one(i: int) -> tuple[str, str, dt.datetime]:
        for attempt in range(5):  # Azurite drops a connection now and then under this many writers
            try:
                name = f"bench/{i // 1000:03d}/drop-{i:06d}.csv"
                done = store.blob(names.INCOMING, name).upload_blob(b"t,v\n0,1\n", overwrite=True)
                store.table(names.JOBS_TABLE).upsert_entity(
                    {
                        "PartitionKey": job_id_for(name, done["etag"]),
                        "RowKey": names.JOB_ROW,
                        "status": "succeeded",
                        "reported": True,
                    }
                )
                return name, done["etag"], done["last_modified"]
            except (AzureError, ConnectionError):
                time.sleep(0.5 * (attempt + 1))
        raise RuntimeError(f"setup of blob {i} failed 5 times")

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(one, range(first, first + n)))


def timed(fn) -> tuple[float, object]:
    t = time.perf_counter()
    value = fn()
    return time.perf_counter() - t, value


class State:
    """Save and restore the reconciler's state row, so each repeat starts from the same watermark and cursor."""

    def __init__(self, store: Storage) -> None:
        self.log = ScalingLog(store)

    def save(self) -> str:
        return json.dumps(self.log.reconcile_state())

    def restore(self, state: str) -> None:
        self.log.save_reconcile_state(json.loads(state))

    def cursor(self, cursor: Cursor) -> None:
        state = json.loads(self.save())
        state["changefeed"] = cursor.to_dict()
        self.restore(json.dumps(state))


def median_of(repeat: int, fn, before=lambda: None, runs: list[float] | None = None) -> tuple[float, object]:
    """The median seconds of ``repeat`` calls of ``fn`` (each after ``before``) and the last value; every
    call's seconds are appended to ``runs`` where it is given (the row's spread)."""
    times, value = [], None
    for _ in range(repeat):
        before()
        t, value = timed(fn)
        times.append(t)
    if runs is not None:
        runs += times
    return statistics.median(times), value


def records(uploads: list[tuple[str, str, dt.datetime]]) -> list[dict]:
    """Their BlobCreated records, each with its upload's time (as the feed writes it)."""
    return [event(names.INCOMING, name, etag, when=when) for name, etag, when in uploads]


def old_feed(feed: FeedWriter, uploads: list[tuple[str, str, dt.datetime]], now: dt.datetime) -> dt.datetime:
    """One BlobCreated record per upload, PER_SEGMENT to an hourly segment, ending three hours ago."""
    batches = [uploads[i : i + PER_SEGMENT] for i in range(0, len(uploads), PER_SEGMENT)]
    first = now - (len(batches) + 2) * HOUR
    for k, batch in enumerate(batches):
        feed.append(first + k * HOUR, records(batch), status="Finalized")
    return first


def measure(store: Storage, args) -> dict:
    now = dt.datetime.now(dt.UTC)
    t_setup, uploads = timed(lambda: setup(store, 0, args.blobs, args.threads))
    feed = FeedWriter(store.container(CONTAINER))
    first_segment = old_feed(feed, uploads, now)
    feed.consumable(now)
    print(f"setup: {args.blobs} uploads with job rows and feed records in {t_setup:.1f} s", flush=True)
    time.sleep(1.1)
    listing = dataclasses.replace(Settings(), reconcile_grace_s=0)
    changefeed = dataclasses.replace(listing, reconcile_source="changefeed")
    state = State(store)
    out: dict = {"blobs": args.blobs, "new": args.new, "repeat": args.repeat}
    out["bare_list_s"], listed = timed(lambda: sum(1 for _ in store.list(names.INCOMING)))
    out["cold_s"], cold = timed(lambda: Reconciler(store, listing).run())
    out["warm_s"], warm = timed(lambda: Reconciler(store, listing).run())
    assert listed == args.blobs and cold.actions == [] and warm.actions == [], (listed, cold.actions, warm.actions)
    assert cold.checked == args.blobs and warm.checked == 0
    ledger, sample = Ledger(store), uploads[: args.sample]
    t_naive, _ = timed(lambda: [ledger.job(job_id_for(n, e)) for n, e, _ in sample])
    out["naive_s"] = t_naive * len(uploads) / len(sample)
    state.cursor(Cursor(segment_key(first_segment.replace(minute=0, second=0, microsecond=0))))
    out["catchup_s"], catchup = timed(lambda: Reconciler(store, changefeed).run())
    assert catchup.actions == [] and catchup.events == args.blobs and catchup.listed == 0, catchup.actions[:3]
    out["catchup_events"] = catchup.events
    print(f"catch-up over {catchup.events} feed records: {out['catchup_s']:.2f} s", flush=True)

    time.sleep(1.1)  # listings give last-modified to the second: the new uploads must be past the watermark
    new = setup(store, args.blobs, args.new, args.threads)
    feed.append(now, records(new))
    time.sleep(1.1)
    saved = state.save()
    out["list_s"], listed = median_of(args.repeat, lambda: sum(1 for _ in store.list(names.INCOMING)))
    assert listed == args.blobs + args.new
    for mode, settings in (("listing", listing), ("changefeed", changefeed)):

        def again(saved=saved):
            state.restore(saved)

        def whole_pass(settings=settings):
            return Reconciler(store, settings).run()

        def incoming_step(settings=settings):
            return Reconciler(store, settings).run(steps=("incoming",))

        pass_runs: list[float] = []
        step_runs: list[float] = []
        t_pass, whole = median_of(args.repeat, whole_pass, again, pass_runs)
        t_step, step = median_of(args.repeat, incoming_step, again, step_runs)
        assert whole.actions == [] and step.checked == args.new, (mode, whole, step)
        out[mode] = {
            "pass_s": t_pass,
            "pass_runs_s": pass_runs,
            "incoming_s": t_step,
            "incoming_runs_s": step_runs,
            "listed": step.listed,
            "events": step.events,
            "checked": step.checked,
        }
    assert out["changefeed"]["listed"] == 0 and out["changefeed"]["events"] == args.new
    assert out["listing"]["listed"] == args.blobs + args.new
    Reconciler(store, changefeed).run(steps=("incoming",))  # the cursor past the new records
    after = state.save()
    idle_runs: list[float] = []
    t_idle, idle = median_of(
        args.repeat, lambda: Reconciler(store, changefeed).run(steps=("incoming",)), lambda: state.restore(after),
        idle_runs,
    )
    assert idle.events == 0 and idle.checked == 0
    out["changefeed"]["idle_incoming_s"] = t_idle
    out["changefeed"]["idle_incoming_runs_s"] = idle_runs
    return out


def report(f: dict) -> None:
    n, b, bare = f["blobs"], f["list_s"], f["bare_list_s"]
    print(f"baseline: bare listing of {n} blobs: {bare:.2f} s")
    for label, key in (
        ("cold pass (no watermark, one job-row query)", "cold_s"),
        ("warm pass (watermark past every blob)", "warm_s"),
        ("naive per-blob ledger lookups", "naive_s"),
        (f"change feed catch-up, {f['catchup_events']} records", "catchup_s"),
    ):
        print(f"{label:<46} {f[key]:.2f} s  ratio {f[key] / bare:.2f}")
    print(
        f"then {f['new']} new uploads; baseline: bare listing of {n + f['new']} blobs: {b:.2f} s "
        f"(median of {f['repeat']})"
    )
    for mode in ("listing", "changefeed"):
        m = f[mode]
        print(f"{mode:>10} pass:           {m['pass_s']:.2f} s  ratio {m['pass_s'] / b:.3f}")
        print(
            f"{mode:>10} incoming/ step: {m['incoming_s']:.2f} s  ratio {m['incoming_s'] / b:.3f}  "
            f"({m['listed']} listed, {m['events']} feed records, {m['checked']} checked)"
        )
    idle = f["changefeed"]["idle_incoming_s"]
    print(f"changefeed incoming/ step, nothing new: {idle:.2f} s  ratio {idle / b:.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blobs", type=int, default=10_000)
    parser.add_argument("--new", type=int, default=100, help="uploads that arrive after the watermark/cursor")
    parser.add_argument("--threads", type=int, default=6)
    parser.add_argument("--sample", type=int, default=500, help="blobs for the naive per-blob lookup")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each pass after the new uploads (median)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        emulator = azurite.start_on_free_ports(Path(tmp), in_memory=True)
        try:
            store = Storage(emulator.connection_string)
            store.ensure()
            figures = measure(store, args)
        finally:
            emulator.stop()
    report(figures)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
