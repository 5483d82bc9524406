"""Issue 26's pure parts: the CloudEvent and its required attributes, the webhook signature, what a
manifest may ask (never a secret's value), the heat sweep's order fit, and the Analysis section."""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import math

import pytest

from upwell.after import cloudevents, webhook
from upwell.after.notify import events_for
from upwell.after.spec import NotifySpec, ReduceSpec, of_job, row_fields
from upwell.errors import InputRejected
from upwell.ingest.manifests import load_manifest
from upwell.results.report.analysis import section
from upwell.rows import JobRow, JobState
from workers.payloads import heat_order

pytestmark = pytest.mark.afterjob


def test_job_event_has_the_required_attributes_and_a_stable_id():
    event = cloudevents.job_event("completed", "heat-0123", "ocean", {"job_id": "heat-0123"})
    assert cloudevents.problems(event) == []
    assert event["type"] == "io.upwell.job.completed" and event["subject"] == "jobs/heat-0123"
    assert event["specversion"] == "1.0" and event["source"] == "/upwell/ocean"
    assert event["id"] == cloudevents.job_event("completed", "heat-0123", "ocean", {})["id"]


@pytest.mark.parametrize("broken,says", [
    ({"id": ""}, "missing required attribute 'id'"), ({"source": None}, "missing required attribute 'source'"),
    ({"specversion": "0.3"}, "specversion is '0.3'"), ({"type": 5}, "'type' must be a string"),
    ({"source": "has space"}, "URI-reference"), ({"Bad-Name": 1}, "lower-case letters and digits")])
def test_problems_name_what_breaks_the_spec(broken, says):
    event = {**cloudevents.job_event("failed", "j", "p", {}), **broken}
    assert any(says in p for p in cloudevents.problems(event)), cloudevents.problems(event)


def test_signature_is_hmac_sha256_over_the_exact_body():
    body = webhook.body_of({"b": 1, "a": 2})
    header = webhook.sign(body, b"s3cret")
    assert header.startswith("sha256=") and len(header) == 7 + 64
    assert header == "sha256=" + hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()  # as a receiver checks it
    assert webhook.sign(body, b"other") != header and webhook.sign(body + b"\n", b"s3cret") != header


def test_a_manifest_names_a_secret_never_holds_one():
    m = load_manifest(b"payload: logistic\nnotify: {events: [completed], webhook: {url: 'https://lab.example/h', "
                      b"secret: lab-hook}}\n", "x", ["logistic"])
    assert m.notify.webhook.secret == "lab-hook"
    for bad in (b"secret: 'hunter2 with spaces'", b"secret: lab-hook, token: abc"):
        with pytest.raises(InputRejected):
            load_manifest(b"payload: logistic\nnotify: {webhook: {url: 'https://x/h', " + bad + b"}}\n", "x",
                          ["logistic"])
    with pytest.raises(InputRejected):
        load_manifest(b"payload: logistic\nnotify: {events: [finished]}\n", "x", ["logistic"])


def test_the_asks_survive_the_job_row():
    fields = row_fields("chain a", ReduceSpec(payload="heat-order", artifacts=["*.npz"]),
                        NotifySpec(events=["failed"]))
    ask = of_job(JobRow.from_entity({"PartitionKey": "j", "RowKey": "job", **fields}))
    assert ask.after == "chain a" and ask.reduce.artifacts == ["*.npz"] and ask.notify.events == ["failed"]
    with pytest.raises(ValueError):
        ReduceSpec(payload="x", artifacts=["../up"])


@pytest.mark.parametrize("status,spent,budget,events", [
    (JobState.SUCCEEDED, 0.1, None, ["completed"]), (JobState.PARTIALLY_FAILED, 0, None, ["failed"]),
    (JobState.FAILED, 2.0, 1.0, ["failed", "budget_exceeded"]), (JobState.REJECTED, 0, None, ["quarantined"]),
    (JobState.RUNNING, 0, None, [])])
def test_events_a_job_end_means(status, spent, budget, events):
    assert events_for(JobRow(job_id="j", status=status, spent_usd=spent, budget_usd=budget)) == events


def test_heat_order_fits_the_slope_of_a_second_order_method(tmp_path):
    for nx in (16, 32, 64):
        h = 1.0 / (nx + 1)
        doc = {"status": "succeeded", "params": {"nx": nx}, "metrics": {"l2_error": 0.3 * h * h}}
        (tmp_path / f"s{nx}.json").write_text(json.dumps(doc))
    (tmp_path / "bad.json").write_text(json.dumps({"status": "failed", "params": {"nx": 8}}))
    out = tmp_path / "out"
    assert heat_order.main(["--input", str(tmp_path), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert math.isclose(summary["order"], 2.0, abs_tol=1e-6) and summary["points"] == 3
    assert (out / "convergence.png").read_bytes().startswith(b"\x89PNG")
    assert heat_order.main(["--input", str(tmp_path / "none"), "--out", str(out)]) == heat_order.EXIT_BAD_INPUT


def test_analysis_section_shows_figures_metrics_files_and_a_failure():
    png = b"\x89PNG\r\n\x1a\n" + b"0" * 10
    blobs = {"results/j-reduce1/reduce/fit.png": png, "results/j-reduce1/reduce/table.csv": b"a,b\n"}
    done = section({"status": "succeeded", "job_id": "j-reduce1", "attempt": 1, "metrics": {"order": 1.98},
                    "artifacts": {"fit.png": "results/j-reduce1/reduce/fit.png",
                                  "table.csv": "results/j-reduce1/reduce/table.csv"}}, blobs.__getitem__)
    assert done.title == "Analysis" and done.figures[0].png == png
    assert done.tables[0].rows == [["order", 1.98]] and done.tables[1].rows[0][0] == "table.csv"
    failed = section({"status": "failed", "job_id": "j-reduce1", "attempt": 1, "error": "exit 65",
                      "log": "results/j-reduce1/reduce/payload.log"}, io.BytesIO().read)
    assert failed.title == "Analysis failed" and "Done, analysis failed" in failed.text
    assert "results/j-reduce1/reduce/payload.log" in failed.text
    silent = section({"status": "failed", "job_id": "j-reduce1", "attempt": 1, "error": "exit 1", "log": ""},
                     io.BytesIO().read)  # it printed nothing, so kept no log (upwell.after.reduce.view)
    assert "It printed nothing." in silent.text and "payload.log" not in silent.text
