"""Issue 26 end to end, on one stack for the module (Azurite, the devhost on the real function_app, local
workers started by the scale timer): the heat sweep's reduce, a failing reduce and `rerun --reduce`, a
duplicate "done", the chain A -> B, a failed parent, a cycle, and notifications to a receiver the test
starts (signed CloudEvents; 500 three times then 200; a receiver that never answers)."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import threading
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.pipeline_helpers import POOLS, REPO, pipeline_env, running_host, wait_for, wait_reported
from upwell import names
from upwell.after import cloudevents, hook, webhook
from upwell.errors import InputRejected, NotFound
from upwell.ingest.blobnames import job_id_for
from upwell.ingest.ingestor import Ingestor
from upwell.ledger import Ledger
from upwell.lifecycle.rerun import rerun_reduce
from upwell.payloads.registry import Registry
from upwell.results.status import job_status
from upwell.settings import Settings
from upwell.storage import Storage

pytestmark = [pytest.mark.afterjob, pytest.mark.timeout(600)]  # one stack, every job at once; slow on a loaded machine
SECRET = b"lab-webhook-secret-1"
IMAGE = "upwell.azurecr.io/lab@sha256:" + "ab" * 32
QUICK = "payload: logistic\nparams: {steps: 200, burn_in: 10, sleep_s: 0}\ngrid: {r: [3.1, 3.5]}\n"


def definition(name: str, version: str, script: str, *, needs_input: bool = True) -> bytes:
    """A lab's definition whose tool is a Python script carried in the definition itself (``files``)."""
    body = "\n".join("    " + line for line in script.strip().splitlines())
    return (f"schema: 1\nname: {name}\nversion: {version}\nowner: lab\nimage: {IMAGE}\npool: cpu\n"
            f"files:\n  tool.py: |\n{body}\n"
            f"command: ['{{python}}', tool.py, '{{input}}', '{{out}}']\n"
            f"input: {{required: {str(needs_input).lower()}, path: input/results}}\n"
            "outputs: {metrics_json: out/metrics.json}\n").encode()


# Braces are doubled: a definition's files are templates.
COUNT = """
import json, pathlib, sys
docs = [json.loads(p.read_text()) for p in sorted(pathlib.Path(sys.argv[1]).glob('*.json'))]
ok = [d for d in docs if d.get('status') == 'succeeded']
out = pathlib.Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
(out / 'metrics.json').write_text(json.dumps(dict(parent_results=len(ok), parent_job=ok[0]['job_id'])))
"""
BROKEN = """
import sys
print('reduce: cannot read the results (a bug in version 1.0.0)', file=sys.stderr)
sys.exit(65)
"""
FAILS = """
import sys
sys.exit(65)
"""


class Receiver:
    """A webhook receiver on 127.0.0.1: /ok answers 200, /flaky 500 three times then 200, /hang never.

    Delivery is at least once: a try whose answer came after the sender's timeout (a loaded machine) is
    tried again with the same CloudEvent, which a real receiver drops by its ``id``. ``events`` does that."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict, bytes]] = []
        self.answered: list[tuple[str, int]] = []
        self.flaky = 0
        self.release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.requests.append((self.path, dict(self.headers.items()), body))
                if self.path == "/hang":
                    receiver.release.wait(30)
                    return
                status = 200
                if self.path == "/flaky":
                    receiver.flaky += 1
                    status = 500 if receiver.flaky <= 3 else 200
                receiver.answered.append((self.path, status))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def at(self, path: str) -> list[tuple[dict, bytes]]:
        return [(h, b) for p, h, b in self.requests if p == path]

    def events(self, path: str) -> list[dict]:
        """The distinct events posted to ``path``, as a receiver keeps them: one per CloudEvent id, and every
        copy of an id byte for byte the first (the same signed body)."""
        kept: dict[str, bytes] = {}
        for _, body in self.at(path):
            first = kept.setdefault(json.loads(body)["id"], body)
            assert first == body, "a copy of an event differs from the first"
        return [json.loads(b) for b in kept.values()]

    def statuses(self, path: str) -> list[int]:
        return [status for p, status in self.answered if p == path]

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def stack(azurite, tmp_path_factory):
    """One host for the module: its settings (short notification backoff), a receiver, the lab's definitions."""
    state = tmp_path_factory.mktemp("after-stack")
    (state / "secrets").mkdir()
    (state / "secrets" / "lab-hook").write_bytes(SECRET + b"\n")
    store = Storage(azurite.connection_string)
    store.ensure()
    registry = Registry(store)
    for doc in (definition("count-results", "1.0.0", COUNT), definition("broken-reduce", "1.0.0", BROKEN),
                definition("always-fails", "1.0.0", FAILS, needs_input=False)):
        registry.push(doc, "lab.yaml")
    receiver = Receiver()
    with ExitStack() as stack, pytest.MonkeyPatch.context() as mp:
        stack.callback(receiver.close)
        pools = {**POOLS, "cpu": {**POOLS["cpu"], "max_nodes": 3}}
        pipeline_env(mp, azurite.connection_string, state, UPWELL_POOLS=json.dumps(pools),
                     UPWELL_SECRETS_DIR=str(state / "secrets"),
                     UPWELL_NOTIFY_ATTEMPTS="4", UPWELL_NOTIFY_BACKOFF_S="0.05", UPWELL_NOTIFY_TIMEOUT_S="2",
                     UPWELL_RETRY_BACKOFF_S="0.1")
        stack.enter_context(running_host(azurite.connection_string, state))
        yield store, receiver, submit(store, receiver)


def submit(store: Storage, receiver: Receiver) -> dict[str, str]:
    """Every job of the module, uploaded at once so that they run side by side; name -> job id."""
    sample = (REPO / "samples" / "heat-sweep" / "job.yaml").read_text()
    assert "reduce:" in sample and "heat-order" in sample  # the sample itself names its reduce
    # four of its six grids on one rank each: the fit is as good (1.95; 1.97 with six) in less time
    sample = sample.replace("nx: [16, 24, 32, 48, 64, 128]", "nx: [16, 24, 32, 48]").replace("ranks: 2", "ranks: 1")
    assert "nx: [16, 24, 32, 48]" in sample and "ranks: 1" in sample
    jobs = {"heat": upload(store, "after/heat/job.yaml", sample),
            "broken": upload(store, "after/broken/job.yaml",
                             f"name: broken analysis\n{QUICK}reduce: {{payload: broken-reduce}}\n"),
            "b": upload(store, "after/chain-b/job.yaml", "name: chain b\npayload: count-results\nafter: chain a\n")}
    jobs["fail-a"] = upload(store, "after/fail-a/job.yaml", "name: failing a\npayload: always-fails\n")
    jobs["fail-b"] = upload(store, "after/fail-b/job.yaml", f"name: after failing a\n{QUICK}after: {jobs['fail-a']}\n")
    for key, path in (("ok0", "/ok"), ("ok1", "/ok"), ("flaky", "/flaky"), ("hang", "/hang")):
        jobs[key] = notified(store, path, receiver, f"notify {key}")
    jobs["bad"] = upload(store, "after/bad/job.yaml",
                         f"payload: logistic\nshell: rm -rf /\nnotify: {{events: [quarantined], "
                         f"webhook: {{url: '{receiver.url}/quarantined', secret: lab-hook}}}}\n")
    return jobs


def upload(store: Storage, name: str, text: str) -> str:
    etag = store.blob(names.INCOMING, name).upload_blob(text.encode(), overwrite=True)["etag"]
    return job_id_for(name, etag)


def analysed(store: Storage, job_id: str, timeout: float = 300.0, attempt: int = 1):
    """The job row once analysis ``attempt`` has ended and the report shows it (summary.json's analysis has that
    attempt's state: a report built while the reduce still ran is built again)."""
    ledger = Ledger(store)

    def ended():
        job = ledger.job(job_id)
        state = (job.extra or {}).get("analysis_state") if job else None
        if state not in ("succeeded", "failed") or int(job.extra.get("analysis_attempt") or 0) != attempt:
            return None
        try:
            shown = json.loads(store.read(f"reports/{job_id}/summary.json")).get("analysis") or {}
        except NotFound:
            return None
        return job if shown.get("status") == state and shown.get("attempt") == attempt else None

    return wait_for(ended, timeout, f"the analysis of {job_id}", lambda: str(ledger.job(job_id)))


def test_heat_sweep_report_shows_fitted_order_and_plot_and_a_duplicate_done_runs_it_once(stack):
    store, _, jobs = stack
    job_id = jobs["heat"]
    job = analysed(store, job_id)
    assert job.status == "succeeded" and job.extra["analysis_state"] == "succeeded", job.extra
    summary = json.loads(store.read(f"reports/{job_id}/summary.json"))
    order = summary["analysis"]["metrics"]["order"]
    assert abs(order - 2.0) <= 0.1 and summary["analysis"]["metrics"]["points"] == 4
    html = store.read(f"reports/{job_id}/index.html").decode()
    assert ">Analysis<" in html and "convergence.png (from the analysis)" in html
    assert re.search(r">order<.{0,80}>" + re.escape(f"{order:.4g}")[:4], html, re.S), "the order in the table"
    assert any(f.startswith("figures/analysis") for f in summary["figures"])
    # A duplicate "done": the host's report message again, and the transition run again on a stale row.
    ledger = Ledger(store)
    store.send(names.REPORT_QUEUE, json.dumps({"job_id": job_id}))
    stale = ledger.job(job_id)
    stale = type(stale).from_entity({k: v for k, v in stale.to_entity().items() if not k.startswith("analysis_")})
    assert hook.job_done(store, ledger, stale, Settings.from_env()) == []
    reduce_jobs = [j.job_id for j in ledger.jobs() if (j.extra or {}).get("reduce_of") == job_id]
    assert reduce_jobs == [f"{job_id}-reduce1"]
    [shard] = ledger.shards(f"{job_id}-reduce1")
    assert shard.attempts == 1 and ledger.job(job_id).extra["analysis_attempt"] == 1


def test_failed_reduce_keeps_results_and_report_then_rerun_reduce_succeeds(stack):
    store, _, jobs = stack
    job_id = jobs["broken"]
    job = analysed(store, job_id)
    assert job.status == "succeeded" and job.extra["analysis_state"] == "failed"
    results = sorted(b.name for b in store.list(names.RESULTS, f"{job_id}/"))
    assert [r for r in results if r.count("/") == 1] == [f"{job_id}/s00000.json", f"{job_id}/s00001.json"]
    html = store.read(f"reports/{job_id}/index.html").decode()
    assert "Analysis failed" in html and "Done, analysis failed" in html and "s00001" in html
    assert f"results/{job_id}-reduce1/reduce/payload.log" in html
    log_text = store.read(f"results/{job_id}-reduce1/reduce/payload.log").decode()
    assert "a bug in version 1.0.0" in log_text
    assert "done, analysis failed" in " ".join(job_status(store, job_id)["after_lines"])
    fixed = definition("broken-reduce", "1.0.1", COUNT.replace("parent_results", "results_read"))
    Registry(store).push(fixed, "lab.yaml")
    assert rerun_reduce(store, job_id) == f"{job_id}-reduce2"
    job = analysed(store, job_id, 120, attempt=2)
    assert job.extra["analysis_state"] == "succeeded", job.extra
    summary = json.loads(store.read(f"reports/{job_id}/summary.json"))
    assert summary["analysis"]["metrics"]["results_read"] == 2 and summary["analysis"]["attempt"] == 2
    assert summary["counts"]["succeeded"] == 2  # the shards' results as they were


def test_chain_a_then_b_each_reported_once_b_reads_a_results(stack):
    store, _, jobs = stack
    b_id = jobs["b"]
    ledger = Ledger(store)
    assert wait_for(lambda: (j := ledger.job(b_id)) and j.status == "waiting" and j, 30, "b waiting")
    a_id = upload(store, "after/chain-a/job.yaml", f"name: chain a\n{QUICK}")
    a = wait_reported(store, a_id)
    b = wait_reported(store, b_id)
    assert a.status == b.status == "succeeded" and a.report_count == b.report_count == 1
    [result] = [json.loads(store.read(f"results/{b_id}/{s.shard_id}.json")) for s in ledger.shards(b_id)]
    assert result["metrics"] == {"parent_results": 2, "parent_job": a_id}
    assert store.read(f"reports/{a_id}/index.html") and store.read(f"reports/{b_id}/index.html")
    assert job_status(store, b_id)["chain"]["parent"] == a_id
    assert job_status(store, a_id)["chain"]["children"] == [b_id]
    assert f"then: {b_id} (succeeded)" in job_status(store, a_id)["after_lines"]


def test_failed_parent_cancels_the_waiting_child_with_the_reason(stack):
    store, _, jobs = stack
    a_id, b_id = jobs["fail-a"], jobs["fail-b"]
    a = wait_reported(store, a_id)
    assert a.status == "failed"
    ledger = Ledger(store)
    b = wait_for(lambda: (j := ledger.job(b_id)) and j.status == "cancelled" and j, 30, "b cancelled")
    assert f"job {a_id}" in b.message and "ended failed without succeeding" in b.message
    assert b.shards_total == 0 and not list(store.list(names.RESULTS, f"{b_id}/"))


def test_a_cycle_is_refused_at_submit(stack):
    store, _, _ = stack
    ingestor = Ingestor(store, Settings.from_env())
    store.blob(names.INCOMING, "after/cyc-x/job.yaml").upload_blob(
        f"name: cycle x\n{QUICK}after: cycle y\n".encode(), overwrite=True)
    assert ingestor.ingest("after/cyc-x/job.yaml").status == "waiting"
    store.blob(names.INCOMING, "after/cyc-y/job.yaml").upload_blob(
        f"name: cycle y\n{QUICK}after: cycle x\n".encode(), overwrite=True)
    out = ingestor.ingest("after/cyc-y/job.yaml")
    assert out.status == "rejected" and "a cycle (cycle y -> " in out.message, out
    err = json.loads(store.read("quarantine/after/cyc-y/job.yaml.error.json"))
    assert err["field"] == "after"
    store.blob(names.INCOMING, "after/cyc-self/job.yaml").upload_blob(
        f"name: cycle self\n{QUICK}after: cycle self\n".encode(), overwrite=True)
    assert ingestor.ingest("after/cyc-self/job.yaml").status == "rejected"
    with pytest.raises(InputRejected):  # after: is checked like any field
        from upwell.ingest.manifests import load_manifest
        load_manifest(b"payload: logistic\nafter: '../x'\n", "x", ["logistic"])


def notified(store: Storage, path: str, receiver: Receiver, name: str) -> str:
    text = (f"name: {name}\n{QUICK}"
            f"notify: {{events: [completed, failed], webhook: {{url: '{receiver.url}{path}', secret: lab-hook}}}}\n")
    return upload(store, f"after/{name.replace(' ', '-')}/job.yaml", text)


def delivered(ledger: Ledger, job_id: str) -> bool:
    job = ledger.job(job_id)
    return job is not None and "completed" in str(job.extra.get("notify_delivered") or "")


def test_receiver_gets_one_signed_completed_cloudevent_per_job(stack):
    store, receiver, jobs = stack
    ids = [jobs["ok0"], jobs["ok1"]]
    ledger = Ledger(store)
    for job_id in ids:
        wait_for(lambda j=job_id: delivered(ledger, j), 120, f"{job_id} delivered")
        job = ledger.job(job_id)
        hook.job_done(store, ledger, job, Settings.from_env())  # a duplicate "done" sends nothing more
    events = receiver.events("/ok")
    assert sorted(e["subject"] for e in events) == sorted(f"jobs/{j}" for j in ids)  # exactly one each
    for headers, body in receiver.at("/ok"):
        expected = "sha256=" + hmac.new(SECRET, body, hashlib.sha256).hexdigest()  # the receiver's own check
        assert hmac.compare_digest(headers[webhook.SIGNATURE_HEADER], expected)
        event = json.loads(body)
        assert cloudevents.problems(event) == []
        assert event["specversion"] == "1.0" and event["type"] == "io.upwell.job.completed"
        assert event["datacontenttype"] == "application/json" and event["time"].endswith("Z")
        assert event["data"]["status"] == "succeeded" and event["data"]["shards_done"] == 2
        assert headers["Content-Type"].startswith("application/cloudevents+json")


def test_receiver_failing_three_times_then_ok_gets_it_delivered_once(stack):
    store, receiver, jobs = stack
    job_id = jobs["flaky"]
    ledger = Ledger(store)
    wait_for(lambda: delivered(ledger, job_id), 120, "delivered")
    [event] = receiver.events("/flaky")  # every try the same event
    assert event["subject"] == f"jobs/{job_id}"
    assert receiver.statuses("/flaky")[:4] == [500, 500, 500, 200]  # the fourth taken
    assert not ledger.job(job_id).extra.get("notify_failed")


def test_receiver_that_never_answers_leaves_notification_failed_and_nothing_else(stack):
    store, receiver, jobs = stack
    job_id = jobs["hang"]
    ledger = Ledger(store)
    job = wait_for(lambda: (j := ledger.job(job_id)) is not None and j.extra.get("notify_failed") and j, 120,
                   "notification failed")
    assert job.extra["notify_failed"].startswith("notification failed: completed")
    assert "no answer within 2 s after 4 tries" in job.extra["notify_failed"]
    assert len(receiver.at("/hang")) == 4
    assert job.status == "succeeded" and job.reported and job.shards_done == 2
    assert store.read(f"reports/{job_id}/index.html")
    assert "notification failed: completed" in " ".join(job_status(store, job_id)["after_lines"])


def test_a_quarantined_manifest_that_asked_is_told(stack):
    store, receiver, jobs = stack
    wait_for(lambda: receiver.at("/quarantined"), 120, "the quarantined event")
    [event] = receiver.events("/quarantined")
    assert event["type"] == "io.upwell.job.quarantined" and event["subject"] == f"jobs/{jobs['bad']}"
    assert event["data"]["status"] == "rejected" and "shell" in event["data"]["message"]
    assert cloudevents.problems(event) == []
