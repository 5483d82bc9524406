"""Job ids as a user meets them, on Azurite, through the CLI with output to a pipe (not a terminal):
whole ids in `status`, a job named by id, name or upload path, `submit` lines never wrapped, and `watch`
that says "no such job" at once."""

from __future__ import annotations

import time

from typer.testing import CliRunner

from upwell import logs, names
from upwell.cli import app
from upwell.ingest.ingestor import Ingestor
from upwell.settings import Settings
from upwell.storage import Storage

runner = CliRunner()
# Log to pytest's stderr, not to a CliRunner stream that closes after the first command.
logs.configure()
LONG = "a-rather-long-folder-name-for-a-sweep-of-the-logistic-map"


def _cli(*args: str):
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


def _ingest(store: Storage, path: str, manifest: str) -> str:
    store.blob(names.INCOMING, path).upload_blob(manifest.encode(), overwrite=True)
    return Ingestor(store, Settings()).ingest(path).job_id


def test_status_shows_whole_ids_and_takes_a_name_or_path(store):
    ids = [_ingest(store, f"ids/{LONG}-{i}/job.yaml", f"name: sweep number {i}\npayload: logistic\n"
                   f"grid: {{r: [3.{i}]}}\n") for i in range(2)]
    assert all(len(i) > 50 for i in ids)
    code, out = _cli("status")
    assert code == 0
    for job_id in ids:
        line = next((ln for ln in out.splitlines() if job_id in ln), None)
        assert line is not None, f"{job_id} not whole in:\n{out}"
        assert "accepted" in line and "logistic" in line, out  # one row, one line
    code, out = _cli("status", "sweep number 1")
    assert code == 0 and ids[1] in out and "accepted" in out, out
    code, out = _cli("status", f"ids/{LONG}-0")  # the folder that was uploaded
    assert code == 0 and ids[0] in out, out
    code, out = _cli("status", f"incoming/ids/{LONG}-0/job.yaml")
    assert code == 0 and ids[0] in out, out
    code, out = _cli("status", ids[0][:-4])  # a unique start of the id
    assert code == 0 and ids[0] in out, out
    code, out = _cli("status", "no-such-thing-123")
    assert code == 1 and "no such job" in out, out


def test_the_same_path_twice_means_the_newest_and_says_so(store):
    first = _ingest(store, "ids/twice/job.yaml", "payload: logistic\ngrid: {r: [3.1]}\n")
    time.sleep(0.01)
    second = _ingest(store, "ids/twice/job.yaml", "payload: logistic\ngrid: {r: [3.2]}\n")
    assert first != second
    code, out = _cli("status", "ids/twice")
    assert code == 0 and f"{second} " in out.replace("\n", " ") and "newest of 2" in out and first in out, out


def test_submit_prints_each_id_on_its_line_when_piped(store, tmp_path):
    folder = tmp_path / f"{LONG}-{'x' * 30}"
    folder.mkdir()
    (folder / "job.yaml").write_text("payload: logistic\ngrid: {r: [3.3]}\n")
    code, out = _cli("submit", str(folder), "--prefix", "ids/piped")
    assert code == 0, out
    lines = [ln for ln in out.splitlines() if ln.startswith("uploaded")]
    assert len(lines) == 1 and len(lines[0]) > 120, out  # one line, not wrapped at 80 columns
    job_id = lines[0].rsplit("job ", 1)[1].rstrip(")")
    assert job_id.startswith(LONG[:20]) and len(job_id) > 40, lines[0]


def test_watch_on_an_unknown_id_says_no_such_job_at_once(store):
    started = time.monotonic()
    code, out = _cli("watch", "logistic-0123456789ab", "--timeout", "60")
    assert code == 1 and "no such job" in out, out
    assert time.monotonic() - started < 10
    # An upload not yet ingested is not unknown: watch waits for it (here, until its short timeout).
    from upwell.ingest.blobnames import job_id_for

    blob = store.blob(names.INCOMING, "ids/pending/job.yaml")
    etag = blob.upload_blob(b"payload: logistic\n", overwrite=True)["etag"]
    code, out = _cli("watch", job_id_for("ids/pending/job.yaml", etag), "--timeout", "1")
    assert code == 1 and "no such job" not in out, out


def test_watch_on_a_path_just_uploaded_waits_for_its_ingest(store):
    """`submit ... --prefix runs/` then at once `watch runs/<folder>`: the upload is there, its job not yet."""
    store.blob(names.INCOMING, "ids/just-now/job.yaml").upload_blob(b"payload: logistic\n", overwrite=True)
    for path in ("ids/just-now", "incoming/ids/just-now/job.yaml"):
        code, out = _cli("watch", path, "--timeout", "1")
        assert code == 1 and "no such job" not in out and "waiting" in out, out
    code, out = _cli("watch", "ids/never-uploaded", "--timeout", "60")
    assert code == 1 and "no such job" in out, out
