"""Issue 24, item 4: listing jobs reads the job catalogue, never the `jobs` table's shard rows.

One Azurite for the module. Every storage request of each listing path is counted (``tests.faults.
request_meter``, which sees every SDK request of this process) together with its URL, so that a query of the
`jobs` table is told from a point read and its ``$filter`` checked for a PartitionKey.

- ``test_listings_cost_the_same_after_10_and_200_finished_jobs``: the job list API for one project, a
  project's spend for its budget, ``upwell status <name>``'s lookup, a reconcile pass and the prune's
  candidates run after 10 finished jobs of project ``lab`` (50 shard rows each) and again after 190 more
  of project ``archive``: each returns the same and makes the same number of requests at both sizes, and
  none of them queries `jobs` without a PartitionKey (the check itself is shown to catch such a scan).
- ``test_the_first_reconcile_pass_backfills_the_catalogue_once``: job rows written before the catalogue
  existed (no catalogue entity, no index entry) are catalogued and indexed by the first pass, which also
  requeues the report of an unreported one; that pass makes the one scan, and the next makes none.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.faults import harness
from tests.faults.request_meter import RequestMeter
from upwell import jobcatalog, jobindex, names
from upwell.access.principal import Caller
from upwell.cost import budgets
from upwell.ingest.blobnames import job_id_for
from upwell.ledger import JobRow, JobState, Ledger, ShardRow, ShardState
from upwell.lifecycle import cleanup
from upwell.lifecycle.find import find_job
from upwell.ops.jobapi import JobAPI
from upwell.ops.reconcile import CATALOG, Reconciler
from upwell.scalelog import ScalingLog, fresh_reconcile_state
from upwell.settings import Settings

SHARDS = 50  # shard rows per finished job: what a scan of the jobs table would read besides the job rows
DAY = 86400.0


class UrlMeter(RequestMeter):
    """A RequestMeter that also keeps each request's method and URL."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[tuple[str, str]] = []

    def count(self, method: str, url: str) -> None:
        super().count(method, url)
        self.urls.append((method, url))

    def job_scans(self) -> list[str]:
        """The `jobs` table's queries whose filter names no PartitionKey (a table scan)."""
        out = []
        for method, url in self.urls:
            parts = urlsplit(url)
            if method == "GET" and parts.path.rstrip("/").endswith(f"/{names.JOBS_TABLE}()"):
                flt = " ".join(parse_qs(parts.query).get("$filter", [""]))
                if "PartitionKey eq" not in flt:
                    out.append(flt)
        return out


def metered(fn: Callable[[], object]) -> tuple[object, UrlMeter]:
    meter = UrlMeter()
    with meter:
        out = fn()
    return out, meter


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[harness.Stack]:
    with harness.module_stack(tmp_path_factory.mktemp("catalog")) as stack:
        yield stack


def _iso(epoch_s: float) -> str:
    return jobcatalog.iso(epoch_s)


def finish_jobs(ledger: Ledger, ids: list[str], *, project: str, ago_s: float, monkeypatch,
                names_of: Callable[[int], str] = lambda i: "") -> None:
    """Jobs of ``project`` created and ended ``ago_s`` ago through the ledger (catalogue, index, job row),
    SHARDS succeeded shard rows each, reported, $1.50 spent each."""
    then = time.time() - ago_s
    monkeypatch.setattr(jobindex, "time", SimpleNamespace(time=lambda: then))  # their ended entries: then

    def one(i: int) -> None:
        job_id = ids[i]
        ledger.create_job(JobRow(job_id=job_id, status=JobState.ACCEPTED, project=project, owner="owner-a",
                                 name=names_of(i), pool="cpu", payload="logistic", shards_total=SHARDS,
                                 created_at=_iso(then - 60)))
        ledger.add_shards(job_id, [ShardRow(job_id=job_id, shard_id=f"s{k:05d}", status=ShardState.SUCCEEDED,
                                            pool="cpu") for k in range(SHARDS)])
        ledger.update_job(job_id, status=JobState.SUCCEEDED, shards_done=SHARDS, spent_usd=1.5,
                          finished_at=_iso(then), reported=True)

    try:
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(one, range(len(ids))))
    finally:
        monkeypatch.undo()


def listing_paths(storage, ledger: Ledger, settings: Settings) -> dict[str, Callable[[], object]]:
    """Each listing path, as a call whose result is comparable."""
    viewer = Caller(kind="user", name="viewer", projects=frozenset({"lab"}))
    since = datetime.now(UTC) - timedelta(days=30)
    state = {"watermark": 0.0, "redrives": {}, "catalog": CATALOG, "last_pass": time.time() - 60,
             "after_pass": time.time() - 60}

    def reconcile() -> object:
        ScalingLog(storage).save_reconcile_state(dict(state))  # the same pass at both sizes
        done = Reconciler(storage, dataclasses.replace(settings, reconcile_grace_s=0), ledger).run()
        return (done.listed, done.checked, [a.kind for a in done.actions])

    return {
        "job list API": lambda: [j["job_id"] for j in JobAPI(storage, settings, viewer).jobs()],
        "budget spend": lambda: budgets.spent(ledger, "project", "lab", since),
        "find by name": lambda: find_job(storage, "calibration", ledger).job_id,
        "reconcile pass": reconcile,
        "prune candidates": lambda: [j.job_id for j in cleanup.prune_candidates(storage, timedelta(days=30),
                                                                                ledger=ledger)],
    }


def test_listings_cost_the_same_after_10_and_200_finished_jobs(world):
    storage, settings = world.storage, Settings.from_env()
    ledger = Ledger(storage)
    patch = pytest.MonkeyPatch()
    lab = [f"lab-{i:03d}" for i in range(8)]
    finish_jobs(ledger, lab, project="lab", ago_s=2 * DAY, monkeypatch=patch,
                names_of=lambda i: "calibration" if i == 3 else f"sweep {i}")
    finish_jobs(ledger, ["lab-old-0", "lab-old-1"], project="lab", ago_s=40 * DAY, monkeypatch=patch)
    etag = storage.blob(names.INCOMING, "lab/run.csv").upload_blob(b"x,y\n1,2\n", overwrite=True)["etag"]
    upload_job = job_id_for("lab/run.csv", etag)  # an upload whose job is there: the pass point-reads it
    ledger.create_job(JobRow(job_id=upload_job, status=JobState.SUCCEEDED, project="other", reported=True,
                             created_at=_iso(time.time()), finished_at=_iso(time.time())))
    seen: dict[int, dict[str, tuple[object, int]]] = {}
    for size in (10, 200):
        if size == 200:
            finish_jobs(ledger, [f"archive-{i:04d}" for i in range(190)], project="archive", ago_s=3 * DAY,
                        monkeypatch=patch, names_of=lambda i: f"sweep {i}")
        seen[size] = {}
        for path, call in listing_paths(storage, ledger, settings).items():
            result, meter = metered(call)
            assert meter.job_scans() == [], (path, meter.job_scans())
            seen[size][path] = (result, meter.total)
            print(size, path, meter.total, dict(meter.detail))
    listed = seen[10]["job list API"][0]
    assert set(listed) == {*lab, "lab-old-0", "lab-old-1"} and set(listed[-2:]) == {"lab-old-0", "lab-old-1"}
    assert seen[10]["budget spend"][0] == 8 * 1.5
    assert seen[10]["find by name"][0] == "lab-003"
    assert seen[10]["reconcile pass"][0] == (1, 1, [])
    assert seen[10]["prune candidates"][0] == ["lab-old-0", "lab-old-1"]
    assert seen[200] == seen[10], {p: (seen[10][p][1], seen[200][p][1]) for p in seen[10]}
    _, scan = metered(lambda: list(ledger.table.query_entities("RowKey eq 'job'")))  # the check catches a scan
    assert scan.job_scans() == ["RowKey eq 'job'"], scan.urls


def test_the_first_reconcile_pass_backfills_the_catalogue_once(world):
    storage, settings = world.storage, dataclasses.replace(Settings.from_env(), reconcile_grace_s=0)
    ledger, table = Ledger(storage), storage.table(names.JOBS_TABLE)
    old = _iso(time.time() - 5 * DAY)
    legacy = [JobRow(job_id="legacy-done", status=JobState.SUCCEEDED, project="legacy", name="before upgrade",
                     pool="cpu", shards_total=2, shards_done=2, created_at=old, finished_at=old),
              JobRow(job_id="legacy-open", status=JobState.RUNNING, project="legacy", pool="cpu", shards_total=2,
                     created_at=old)]
    for job in legacy:  # written as an older version did: job and shard rows only
        table.submit_transaction([("upsert", r.to_entity()) for r in (job, *(
            ShardRow(job_id=job.job_id, shard_id=f"s{k:05d}", pool="cpu") for k in range(2)))])
    assert list(ledger.jobs(project="legacy")) == [] and "legacy-open" not in {j.job_id for j in ledger.open_jobs()}
    ScalingLog(storage).save_reconcile_state(fresh_reconcile_state())
    storage.queue(names.REPORT_QUEUE).clear_messages()
    first, meter = metered(lambda: Reconciler(storage, settings, ledger).run())
    assert meter.job_scans() == ["RowKey eq 'job'"], meter.job_scans()  # the backfill's one scan
    assert ScalingLog(storage).reconcile_state()["catalog"] == CATALOG
    assert {j.job_id for j in ledger.jobs(project="legacy")} == {"legacy-done", "legacy-open"}
    assert [j.job_id for j in ledger.jobs(JobState.RUNNING, project="legacy")] == ["legacy-open"]
    assert "legacy-open" in {j.job_id for j in ledger.open_jobs()}
    assert ("unreported_job", "legacy-done", "requeued") in [(a.kind, a.target, a.outcome) for a in first.actions]
    _, again = metered(lambda: Reconciler(storage, settings, ledger).run())
    assert again.job_scans() == [], again.job_scans()
