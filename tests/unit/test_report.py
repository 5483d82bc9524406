"""The job report: self-contained HTML, summary.json and figures, from synthetic ledger data."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest

from upwell import cost
from upwell.results.report import build_report
from upwell.results.report.model import merge
from upwell.results.report.summary import tail
from upwell.rows import JobRow, ShardRow

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
JOB = "job-5f3a"
NASTY = "Traceback (most recent call last):\n  File \"run.py\"\nValueError: bad <script>alert('x')</script> & co\n"


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def shard_row(sid: str, status: str, node: str, q: float, s: float | None, f: float | None, **extra) -> dict:
    row = {"PartitionKey": JOB, "RowKey": sid, "status": status, "attempts": 1, "preemptions": 0,
           "queued_at": at(q), "started_at": at(s) if s is not None else None,
           "finished_at": at(f) if f is not None else None, "node": node, "pool": "cpu", "spot": False,
           "node_seconds": (f - s) if f is not None and s is not None else None,
           "params": json.dumps({"r": 2.5 + 0.25 * int(sid[-2:]), "steps": 2000}), "result_blob": ""}
    row.update(extra)
    return row


def result_doc(row: dict, **metrics) -> dict:
    params = json.loads(row["params"])
    return {
        "schema": 1, "job_id": JOB, "shard_id": row["RowKey"], "payload": "sweep-demo", "pool": "cpu",
        "status": "failed" if row["status"] == "failed" else "succeeded", "params": params,
        "metrics": metrics, "artifacts": {},
        "timings": {"queued": row["queued_at"], "started": row["started_at"], "finished": row["finished_at"],
                    "checkpoints": row.get("preemptions", 0) + 1, "preemptions": row.get("preemptions", 0),
                    "attempt": row["attempts"], "resumed_from": 500 if row.get("preemptions") else None},
        "node": {"id": row["node"], "pool": "cpu", "vm_size": "Standard_D4s_v5", "spot": row["spot"]},
        "provenance": {"code_version": "abc1234", "image_digest": "sha256:feed", "input_sha256": "sha256:in",
                       "manifest_hash": "m-77", "params": params, "python": "3.11.9",
                       "packages": {"numpy": "2.4.6", "upwell": "0.1.0"}},
        "error": None, "stderr_tail": "",
    }


@pytest.fixture
def job_data():
    rows = [
        shard_row("s-00", "succeeded", "node-a", 0, 2, 62),
        shard_row("s-01", "succeeded", "node-b", 0, 3, 80),
        shard_row("s-02", "succeeded", "node-a", 0, 78, 130, attempts=2, preemptions=1, spot=True,
                  preempted_node_seconds=14.0, first_started_at=at(63),
                  history=json.dumps([{"node": "node-a", "started": at(63), "finished": at(77),
                                       "status": "preempted"}])),
        shard_row("s-03", "failed", "node-b", 1, 96, 101, attempts=5, error="ValueError: bad input <row 7>",
                  stderr_tail=NASTY),
        shard_row("s-04", "succeeded", "node-b", 1, 102, 150),
    ]
    results = [result_doc(r, mean=0.5 + i / 10, lyapunov=-0.1 * i, converged=True)
               for i, r in enumerate(rows) if r["status"] == "succeeded"]
    results[2]["metrics"]["steps"] = 2000
    results[2]["timings"]["run_s"] = 50.0
    job = {"PartitionKey": JOB, "RowKey": "job", "name": "Logistic sweep <demo>", "description": "r from 2.5 to 3.5",
           "status": "partially_failed", "payload": "sweep-demo", "pool": "cpu", "shards_total": 5,
           "shards_done": 4, "shards_failed": 1, "created_at": at(-5), "finished_at": at(151),
           "estimate_node_seconds": 300, "estimate_usd": 0.02, "budget_usd": 5, "spot": True,
           "price_key": "Standard_D4s_v5", "manifest_hash": "m-77", "input_sha256": "sha256:in",
           "code_version": "abc1234", "source_blob": "incoming/demo/job.yaml", "source_etag": "0x8D"}
    events = [{"pool": "cpu", "ts": at(t), "target": tg, "nodes": n, "visible": v, "in_flight": f,
               "reason": f"backlog {v + f}", "capped_by": cb, "message": ""}
              for t, tg, n, v, f, cb in [(0, 2, 0, 5, 0, ""), (30, 2, 2, 3, 2, "max"), (100, 1, 2, 0, 1, ""),
                                         (160, 0, 1, 0, 0, "")]]
    return job, rows, results, events


def fetch(path: str) -> bytes:
    raise FileNotFoundError(path)


def typed(rows: list[dict]) -> list[ShardRow]:
    """Shard rows as the ledger hands them out: each dict coerced once by ShardRow.from_entity."""
    return [ShardRow.from_entity(r) for r in rows]


def build(job: dict, rows: list[dict], results: list, events: list, fetch) -> dict[str, bytes]:
    """build_report on the rows as stored (dicts, some malformed), typed as the ledger types them."""
    return build_report(JobRow.from_entity(job), typed(rows), results, events, fetch)


@pytest.fixture
def built(job_data):
    job, rows, results, events = job_data
    return build(job, rows, results, events, fetch)


def test_files_and_self_contained_html(built):
    assert {"index.html", "summary.json"} <= set(built)
    html = built["index.html"].decode()
    # No external resources: every src/href is an anchor or a data: URI.
    refs = re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)""", html, flags=re.I)
    assert refs and all(r.startswith(("#", "data:")) for r in refs), refs
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", html, flags=re.I)
    assert "<script" not in html.lower()
    assert "@import" not in html and "url(" not in html
    pngs = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert len(pngs) >= 3  # timeline, scaling, generic metrics
    figs = [k for k in built if k.startswith("figures/")]
    assert {"figures/timeline.png", "figures/scaling.png"} <= set(figs)
    assert all(built[k].startswith(b"\x89PNG") for k in figs)


def test_escapes_nasty_text_and_lists_the_failure(built):
    html = built["index.html"].decode()
    assert "<script>alert" not in html
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in html
    assert "Logistic sweep &lt;demo&gt;" in html
    section = html[html.index('id="failures"'):html.index('id="checkpoints"')]
    assert "s-03" in section and "ValueError: bad input &lt;row 7&gt;" in section
    assert "partially failed" in html


def test_cost_shows_estimate_actual_and_table_date(built):
    html = built["index.html"].decode()
    section = html[html.index('id="cost"'):html.index('id="provenance"')]
    assert "estimate" in section and "actual" in section
    assert cost.load().as_of in section and "2026-11-30" in section
    assert "Standard_D4s_v5" in section and "spot" in section


def test_summary_json(built, job_data):
    job, rows, results, events = job_data
    s = json.loads(built["summary.json"])
    assert s["job"]["id"] == JOB and s["job"]["status"] == "partially_failed"
    assert s["counts"] == {"shards_total": 5, "succeeded": 4, "failed": 1, "preempted": 0, "running": 0,
                           "queued": 0, "other": 0, "poisoned": 0, "results": 4}
    assert s["timings"]["makespan_s"] == pytest.approx(150)
    assert s["timings"]["queue_wait_s"]["n"] == 5 and s["timings"]["run_s"]["p95"] is not None
    # Paid node time: every shard's last attempt, plus the preempted attempt of s-02.
    node_seconds = sum(r["node_seconds"] for r in rows) + 14
    assert s["cost"]["actual_node_seconds"] == pytest.approx(node_seconds)
    assert s["cost"]["earlier_attempts_node_seconds"] == 14
    # Priced at the job's key: one spot shard, the rest pay-as-you-go.
    spot_s = rows[2]["node_seconds"] + 14
    want = cost.estimate(node_seconds - spot_s, "Standard_D4s_v5") + cost.estimate(spot_s, "Standard_D4s_v5", True)
    assert s["cost"]["actual_usd"] == pytest.approx(want)
    assert s["cost"]["estimate_usd"] == 0.02 and s["cost"]["prices_as_of"] == "2026-11-30"
    assert s["cost"]["azure"]["payg_usd"] == pytest.approx(cost.estimate(node_seconds, "Standard_D4s_v5"))
    assert [f["shard_id"] for f in s["failures"]] == ["s-03"]
    assert "<script>" in s["failures"][0]["stderr_tail"]  # raw in JSON; escaped only in HTML
    assert s["checkpoints"]["preemptions"] == 1 and s["checkpoints"]["resumed_shards"] == 1
    assert s["checkpoints"]["compute_saved_s"] == pytest.approx(50.0 * 500 / 1500)
    assert s["provenance"]["values"]["code_version"] == ["abc1234"]
    assert s["provenance"]["params"] == {"common": {"steps": 2000}, "varying": ["r"]}
    assert s["scaling"]["events"] == 4 and s["scaling"]["pools"]["cpu"]["capped"] == 1
    assert len(s["shards"]) == 5 and s["shards"][0]["metrics"]["mean"] == 0.5
    assert set(s["figures"]) == {k for k in built if k.startswith("figures/")}


def test_zero_results_and_empty_everything():
    files = build({}, [], [], [], fetch)
    html = files["index.html"].decode()
    s = json.loads(files["summary.json"])
    assert s["counts"]["shards_total"] == 0 and s["timings"]["makespan_s"] is None
    assert s["cost"]["actual_usd"] == 0 and s["failures"] == []
    assert "No shard has started" in html and "No shard failed" in html
    assert not [k for k in files if k.startswith("figures/")]


def test_all_failed_missing_fields_and_huge_stderr(job_data):
    job = {"PartitionKey": "j-bad", "status": "failed", "price_key": "not-a-key"}
    huge = "x" * 200_000 + "\nlast line <b>"
    # A poisoned shard is stored as failed with poisoned set; a stray job row among the shards is skipped.
    rows = [{"RowKey": "a", "status": "failed", "stderr_tail": huge, "node_seconds": "oops"},
            {"RowKey": "b", "status": "failed", "poisoned": True, "started_at": "not a time", "params": "{not json"},
            {"RowKey": "c"}, {"RowKey": "job", "status": "running"}]
    files = build(job, rows, [None, {"shard_id": "d", "metrics": "nope", "timings": [1]}], [{"ts": None}],
                         fetch)
    s = json.loads(files["summary.json"])
    assert s["job"]["status_label"] == "failed"
    assert s["counts"]["failed"] == 2 and s["counts"]["poisoned"] == 1 and s["counts"]["shards_total"] == 4
    stderr = s["failures"][0]["stderr_tail"]
    assert len(stderr) <= 4000 and stderr.endswith("last line <b>")
    assert s["failures"][0]["stderr_truncated_chars"] > 190_000
    html = files["index.html"].decode()
    assert len(html) < 100_000 and "last line &lt;b&gt;" in html


def test_failing_figures_module_does_not_cost_the_report(job_data, monkeypatch):
    import upwell.results.report as report

    def boom(results, fetch):
        raise RuntimeError("no <artifact>")

    monkeypatch.setattr(report, "sections_for", lambda payload: boom)
    job, rows, results, events = job_data
    html = build(job, rows, results, events, fetch)["index.html"].decode()
    assert "figures unavailable" in html and "no &lt;artifact&gt;" in html


def test_payload_sections_are_embedded_with_their_tables(job_data, monkeypatch):
    import upwell.results.report as report
    from upwell.results.figures import Figure, Section, Table

    png = build(*job_data, fetch)["figures/timeline.png"]
    seen = {}

    def sections(results, fetch):
        seen["n"] = len(results)
        seen["art"] = fetch("results/x/y/field.npz")
        return [Section("Bifurcation", "r against the attractor", figures=[Figure("diagram", png)],
                        tables=[Table("per r", ["r", "mean"], [[2.5, 0.6], [3.0, float("nan")]])])]

    monkeypatch.setattr(report, "sections_for", lambda payload: sections if payload == "sweep-demo" else None)
    files = build(*job_data, lambda path: b"npz:" + path.encode())
    html = files["index.html"].decode()
    assert seen == {"n": 4, "art": b"npz:results/x/y/field.npz"}
    assert "figures/bifurcation.png" in files and "Bifurcation" in html and "<td>2.5</td>" in html
    assert html.count("data:image/png;base64,") == 3  # the section's figure, timeline, scaling


def test_merge_prefers_terminal_ledger_status_and_reads_result_only_shards(job_data):
    _, rows, results, _ = job_data
    views = merge(typed([{**rows[0], "status": "running"}]), results)
    by = {v.shard_id: v for v in views}
    assert by["s-00"].status == "succeeded"  # the result is ahead of the ledger
    assert by["s-04"].has_result and by["s-04"].node_seconds == pytest.approx(48)  # from timings


def test_earlier_attempts_without_history_get_their_own_timeline_row(job_data):
    _, rows, _, _ = job_data
    row = {**rows[2], "history": None}
    (v,) = merge(typed([row]), [])
    drawn = v.attempts_drawn()
    assert [a.status for a in drawn] == ["preempted", "succeeded"]
    assert drawn[0].node == "(earlier attempts)"
    assert (drawn[0].finished - drawn[0].started).total_seconds() == pytest.approx(14)
    assert v.node_seconds == pytest.approx(52 + 14)


def test_tail_keeps_the_end():
    text, cut = tail("\n".join(str(i) for i in range(1000)), max_chars=10_000, max_lines=5)
    assert text.splitlines() == ["995", "996", "997", "998", "999"] and cut > 0


def test_hundred_shards_with_failures_make_one_complete_report(job_data):
    """A hundred shards, six of them failed: every shard counted, every failure listed. (How fast a
    report builds belongs in bench/, not in a timed test.)"""
    job, _, _, events = job_data
    rows, results = [], []
    for i in range(100):
        r = shard_row(f"s-{i:02d}", "succeeded" if i % 17 else "failed", f"node-{i % 8}", i, i + 5, i + 65,
                      stderr_tail="boom\n" * 50 if i % 17 == 0 else "")
        rows.append(r)
        if r["status"] == "succeeded":
            results.append(result_doc(r, mean=i / 100, var=i * 0.01, acf=1 - i / 100))
    files = build(job, rows, results, events, fetch)
    counts = json.loads(files["summary.json"])["counts"]
    assert counts["shards_total"] == 100
    assert (counts["succeeded"], counts["failed"]) == (94, 6), counts
    html = files["index.html"] if isinstance(files["index.html"], str) else files["index.html"].decode()
    assert all(f"s-{i:02d}" in html for i in range(0, 100, 17)), "a failed shard is missing from the report"


def test_a_fresh_start_after_an_unusable_checkpoint_is_named(job_data):
    """Issue 25 item 3: a checkpoint that was dropped for a fresh start, and why, is in the report."""
    job, rows, results, events = job_data
    why = "the tool could not resume from its checkpoint (exit 1): started fresh"
    results[0]["timings"]["fresh_start"] = why
    files = build(job, rows, results, events, fetch)
    ck = json.loads(files["summary.json"])["checkpoints"]
    assert ck["fresh_starts"] == 1 and [r["fresh_start"] for r in ck["shards"] if r["shard_id"] == "s-00"] == [why]
    html = files["index.html"].decode()
    assert "shards started fresh (checkpoint unusable)" in html and f"fresh start: {why}" in html
