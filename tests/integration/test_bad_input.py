"""The bad-input corpus: every entry is quarantined with an error naming the field, row or limit
(or accepted when it is valid), the ledger records the rejection, the original bytes are kept
byte for byte, and the Functions host keeps running.

The corpus is generated here (``CORPUS``). Each entry is ingested through ``Ingestor`` as the
Event Grid trigger would deliver it on Azure; a representative subset also goes through the
devhost driving the real function_app (``test_devhost_quarantines_and_keeps_running``). Names
with '.'/'..' segments or C0 control characters are driven only through the Ingestor: Azurite
cannot list a container holding a name with C0 controls, and the devhost's receipts cannot be
written for dotted names (see docs/reliability.md), so those names would stall its polling.
"""

from __future__ import annotations

import gzip
import http.client
import io
import json
import tarfile
import time
import uuid
import zipfile
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from upwell import names
from upwell.ingest.blobnames import job_id_for
from upwell.ingest.ingestor import Ingestor
from upwell.ledger import Ledger
from upwell.local.azurite import ACCOUNT, ACCOUNT_KEY
from upwell.settings import Settings
from upwell.storage import Storage

RUN = uuid.uuid4().hex[:6]  # a fresh prefix per session: the session Azurite is shared
LIMITS = {"max_upload_bytes": 2 << 20, "max_shards": 50, "data_wait_s": 0}
RULE = {"name": "bad-input corpus", "match": f"bad-{RUN}/*csv/*", "columns": {"time": "float", "a": "int", "b": "str"},
        "shard": {"rows": 2}, "payload": "channel-stats", "params": {"time_column": "time"}}
CSV = b"time,a,b\n0.1,1,x\n0.2,2,y\n0.3,3,z\n"


@dataclass(frozen=True)
class Case:
    id: str
    name: str  # under incoming/bad-<run>/
    data: bytes
    field: str = ""  # the field the error must name; "" for a valid entry
    says: str = ""  # a phrase of the error message
    limit: str = ""  # the limit the error must name, if any
    row: int | None = None
    shards: int = 0  # for a valid entry: how many shards it makes
    raw: bool = False  # upload with the name as is (percent-encoded dots), bypassing the SDK's URL handling

    @property
    def valid(self) -> bool:
        return not self.field


def _zip(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for n, d in files.items():
            z.writestr(n, d)
    return buf.getvalue()


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for n, d in files.items():
            info = tarfile.TarInfo(n)
            info.size = len(d)
            t.addfile(info, io.BytesIO(d))
    return buf.getvalue()


def _manifest(**doc) -> bytes:
    return yaml.safe_dump({"payload": "logistic", "grid": {"r": [3.1, 3.2]}, **doc}).encode()


def _alias_bomb(levels: int = 10) -> bytes:
    lines = ["payload: logistic", "grid: {r: [3.1]}", "params:", "  l0: &l0 [" + ",".join(['"lol"'] * 10) + "]"]
    for i in range(1, levels):
        lines.append(f"  l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 10) + "]")
    return "\n".join(lines).encode() + b"\n"


CORPUS = [
    # instrument drops (sharded by RULE: time float, a int, b str; 2 rows per shard)
    Case("csv-empty", "csv/empty.csv", b"", "document", "is empty"),
    Case("csv-header-only", "csv/header.csv", b"time,a,b\n", "row", "no data rows", row=2),
    Case("csv-truncated-row", "csv/truncated.csv", CSV + b"0.4,4", "row", "row 5 has 2 fields", row=5),
    Case("csv-truncated-quote", "csv/truncated-quote.csv", CSV + b'0.4,4,"unterminated', "row",
         "unexpected end of data", row=5),
    Case("csv-wrong-type", "csv/types.csv", b"time,a,b\n0.1,1,x\n0.2,two,y\n", "a", "'two' is not int", row=3),
    Case("csv-ragged", "csv/ragged.csv", b"time,a,b\n0.1,1,x\n0.2,2,y,extra\n", "row", "row 3 has 4 fields", row=3),
    Case("csv-missing-column", "csv/missing.csv", b"time,b\n0.1,x\n", "a", "lacks required columns", row=1),
    Case("csv-bad-utf8", "csv/latin1.csv", b"time,a,b\n0.1,1,caf\xe9\n", "encoding", "not valid UTF-8"),
    Case("csv-utf16-no-bom", "csv/utf16-nobom.csv", CSV.decode().encode("utf-16-le"), "encoding", "byte-order mark"),
    Case("csv-huge-line", "csv/huge-line.csv", b"time,a,b\n0.1,1," + b"x" * ((1 << 20) + 10) + b"\n", "row",
         "line 2 is longer than", limit="max_line_bytes=1048576"),
    Case("csv-too-large", "csv/large.csv", b"time,a,b\n" + b"0.1,1,x\n" * ((2 << 20) // 8 + 10), "size",
         "the limit is 2097152", limit="max_upload_bytes=2097152"),
    Case("csv-too-many-shards", "csv/many.csv", b"time,a,b\n" + b"0.1,1,x\n" * 120, "shard", "more than 50 shards",
         limit="max_shards=50"),
    Case("csv-zip-in-disguise", "csv/disguised.csv", _zip({"a.csv": CSV}), "document", "zip archive"),
    Case("csv-tar-in-disguise", "csv/disguised-tar.csv", _tar({"a.csv": CSV}), "document", "tar archive"),
    # valid encodings and line endings are accepted
    Case("csv-bom", "csv/bom.csv", CSV.decode().encode("utf-8-sig"), shards=2),
    Case("csv-crlf", "csv/crlf.csv", CSV.replace(b"\n", b"\r\n"), shards=2),
    Case("csv-utf16", "csv/utf16.csv", CSV.decode().encode("utf-16"), shards=2),
    Case("csv-utf16-crlf", "csv/utf16-crlf.csv", CSV.decode().replace("\n", "\r\n").encode("utf-16"), shards=2),
    Case("csv-quoted-newlines", "csv/quoted.csv", b'time,a,b\n0.1,1,"two\nlines, a comma and ""quotes"""\n'
         b"0.2,2,form\x0cfeed and \xe2\x80\xa8 separators\n", shards=1),
    # archives are refused by name, whatever they hold
    Case("archive-zip", "upload.zip", _zip({"job.yaml": _manifest()}), "name", "archives are not accepted"),
    Case("archive-gzip", "csv/data.csv.gz", gzip.compress(CSV), "name", "archives are not accepted"),
    Case("archive-tar", "bundle.tar", _tar({"a.csv": CSV}), "name", "archives are not accepted"),
    # manifests
    Case("manifest-ok", "m/ok/job.yaml", _manifest(), shards=2),
    Case("manifest-crlf-utf16", "m/utf16/job.yaml", _manifest().decode().replace("\n", "\r\n").encode("utf-16"),
         shards=2),
    Case("manifest-empty", "m/empty/job.yaml", b"", "document", "is empty"),
    Case("manifest-list", "m/list/job.yaml", b"- payload: logistic\n", "document", "must be a mapping"),
    Case("manifest-unknown-payload", "m/payload/job.yaml", _manifest(payload="os.system"), "payload",
         "unknown payload 'os.system'"),
    Case("manifest-unknown-pool", "m/pool/job.yaml", _manifest(pool="quantum"), "pool", "pool 'quantum' is not"),
    Case("manifest-extra-field", "m/extra/job.yaml", _manifest(shell="rm -rf /"), "shell", "Extra inputs"),
    Case("manifest-wrong-type", "m/type/job.yaml", _manifest(grid={"r": ["three"]}), "grid.r",
         "valid number", row=0),
    Case("manifest-out-of-range", "m/range/job.yaml", _manifest(grid={"r": [3.1, 7.5]}), "grid.r",
         "less than or equal to 4", row=1),
    Case("manifest-grid-over-limit", "m/grid/job.yaml", _manifest(grid={"r": [3.0] * 8, "x0": [0.5] * 8}),
         "grid", "64 points; the limit is 50", limit="max_shards=50"),
    Case("manifest-param-too-big", "m/param/job.yaml",
         yaml.safe_dump({"payload": "channel-stats", "grid": {"time_column": ["t" * 20000]}}).encode(),
         "params", "the limit is 16384", limit="max_param_bytes=16384"),
    Case("manifest-image", "m/image/job.yaml", _manifest(image="evil/miner:latest"), "image", "allowlist"),
    Case("manifest-budget", "m/budget/job.yaml", _manifest(budget_usd=0.0000001,
                                                           estimate={"node_seconds_per_shard": 3600}),
         "budget_usd", "exceeds the budget", limit="budget_usd=1e-07"),
    Case("manifest-alias-bomb", "m/bomb/job.yaml", _alias_bomb(), "yaml", "expands to more than",
         limit="max_nodes=100000"),
    Case("manifest-alias-cycle", "m/cycle/job.yaml", b"payload: logistic\ngrid: {r: &x [3.0, *x]}\n", "yaml",
         "refers to itself"),
    Case("manifest-python-tag", "m/tag/job.yaml",
         b"payload: !!python/object/apply:os.system ['touch /tmp/upwell-pwned']\ngrid: {r: [3.1]}\n",
         "document", "could not determine a constructor"),
    Case("manifest-json-invalid", "m/json/job.json", b'{"payload": "logistic", "grid": {"r": [3.1,]}}',
         "document", "invalid JSON at line 1", row=1),
    Case("manifest-json-deep", "m/deep/job.json", b"[" * 100_000 + b"]" * 100_000, "document",
         "nested too deeply"),
    Case("manifest-huge-int", "m/int/job.json", b'{"payload": "logistic", "params": {"steps": ' + b"9" * 5000 + b"}}",
         "document", "cannot be read"),
    Case("manifest-too-large", "m/large/job.yaml", b"# " + b"x" * (1 << 20) + b"\npayload: logistic\n", "size",
         "at most 1048576", limit="max_document_bytes=1048576"),
    Case("manifest-zip", "m/zip/job.yaml", _zip({"job.yaml": _manifest()}), "document", "zip archive"),
    Case("manifest-data-dotdot", "m/ref/job.yaml", _manifest(payload="channel-stats", grid={},
                                                             data=["../../secrets.csv"]), "data[0]", "contains '..'"),
    Case("manifest-data-absolute", "m/abs/job.yaml", _manifest(payload="channel-stats", grid={}, data=["/etc/passwd"]),
         "data[0]", "absolute path"),
    Case("manifest-data-missing", "m/missing/job.yaml", _manifest(payload="channel-stats", grid={},
                                                                  data=["nowhere.csv"]), "data[0]", "does not exist",
         limit="data_wait_s=0"),
    # hostile names (the Azure SDK resolves '.' and '..' in URLs, so these are uploaded raw)
    Case("name-dotdot", "names/../escape.csv", CSV, "name", "contains '..'", raw=True),
    Case("name-dot", "names/./dot.csv", CSV, "name", "'.' path segment", raw=True),
    Case("name-control", "names/bell\x07.csv", CSV, "name", "control characters"),
    Case("name-tab", "names/tab\t.csv", CSV, "name", "control characters"),
    Case("name-too-long", "names/" + "n" * 1100 + ".csv", CSV, "name", "the limit is 1024",
         limit="max_name=1024"),
    Case("name-long-unmatched", "names/" + "m" * 995 + ".csv", CSV, "name", "no pipeline rule matches"),
]


def settings() -> Settings:
    return Settings(**LIMITS)


@pytest.fixture(scope="module")
def store(azurite) -> Storage:
    s = Storage(azurite.connection_string)
    s.ensure()
    s.write(f"{names.PIPELINES}/bad-{RUN}.yaml", yaml.safe_dump(RULE).encode())
    yield s
    s.blob(names.PIPELINES, f"bad-{RUN}.yaml").delete_blob()


def raw_upload(azurite, name: str, data: bytes) -> str:
    """PUT the blob with '.' and '..' segments percent-encoded, as a raw REST client can; its ETag."""
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    sas = generate_container_sas(ACCOUNT, names.INCOMING, account_key=ACCOUNT_KEY,
                                 permission=ContainerSasPermissions(write=True, create=True),
                                 expiry=datetime.now(UTC) + timedelta(minutes=10))
    path = "/".join({"..": "%2E%2E", ".": "%2E"}.get(p, p) for p in name.split("/"))
    conn = http.client.HTTPConnection("127.0.0.1", azurite.blob_port, timeout=30)
    conn.request("PUT", f"/{ACCOUNT}/{names.INCOMING}/{path}?{sas}", body=data,
                 headers={"x-ms-blob-type": "BlockBlob", "x-ms-version": "2021-08-06"})
    response = conn.getresponse()
    assert response.status == 201, response.read()
    return response.getheader("ETag")


def upload(store: Storage, azurite, case: Case) -> tuple[str, str]:
    """Upload the case; returns the name as stored (what a trigger delivers) and its job id."""
    name = f"bad-{RUN}/{case.name}"
    if case.raw:
        etag = raw_upload(azurite, name, case.data)
    else:
        etag = store.blob(names.INCOMING, name).upload_blob(case.data, overwrite=True)["etag"]
    return name, job_id_for(name, etag)


def check(store: Storage, job_id: str, case: Case) -> dict:
    """The contract for one corpus entry; returns its job row."""
    ledger = Ledger(store)
    job = ledger.job(job_id)
    assert job is not None, f"{case.id}: no job row"
    if case.valid:
        assert job.status == "accepted", (case.id, job.status, job.message)
        assert int(job.shards_total) == case.shards == len(ledger.shards(job_id))
        return job
    assert job.status == "rejected", (case.id, job.status)
    assert job.error_field == case.field, (case.id, job.error_field, job.message)
    assert case.says in job.message, (case.id, job.message)
    quarantined = job.quarantine_blob
    error = json.loads(store.read(f"{quarantined}.error.json"))
    assert error["field"] == case.field and case.says in error["message"], (case.id, error)
    assert error["limit"] == case.limit, (case.id, error["limit"])
    if case.row is not None:
        assert error["row"] == case.row, (case.id, error["row"], error["message"])
    assert store.read(quarantined) == case.data, f"{case.id}: quarantine is not byte-identical"
    return job


@pytest.mark.parametrize("case", CORPUS, ids=[c.id for c in CORPUS])
def test_corpus_entry(case: Case, store: Storage, azurite):
    name, job_id = upload(store, azurite, case)
    ingestor = Ingestor(store, settings())
    try:
        out = ingestor.ingest(name)
        assert (out.job_id, out.status) == (job_id, "accepted" if case.valid else "rejected"), out
        check(store, job_id, case)
        if not case.valid:
            assert not store.blob(names.INCOMING, name).exists(), f"{case.id}: the original stayed in incoming/"
    finally:
        client = store.blob(names.INCOMING, name)
        if client.exists():  # never leave a name behind that stalls other tests' blob polling
            client.delete_blob()
    assert not Path("/tmp/upwell-pwned").exists()


def test_redelivered_rejection_is_one_job(store: Storage):
    """A second delivery of a rejected upload finds the job and does nothing more."""
    name = f"bad-{RUN}/csv/twice.csv"
    etag = store.blob(names.INCOMING, name).upload_blob(b"time,a,b\n0.1,x,y\n", overwrite=True)["etag"]
    ingestor = Ingestor(store, settings())
    first = ingestor.ingest(name)
    assert first.status == "rejected" and first.job_id == job_id_for(name, etag)
    assert ingestor.ingest(name).status == "skipped"  # the original has moved to quarantine
    assert Ledger(store).job(first.job_id).status == "rejected"


def test_message_size_limit_names_the_limit(store: Storage):
    """A work item over max_message_bytes is refused before anything is dispatched."""
    name = f"bad-{RUN}/m/message/job.yaml"
    store.blob(names.INCOMING, name).upload_blob(_manifest(), overwrite=True)
    out = Ingestor(store, Settings(max_message_bytes=300)).ingest(name)
    assert out.status == "rejected" and "the limit is 300" in out.message
    job = Ledger(store).job(out.job_id)
    assert job.error_field == "params" and not Ledger(store).shards(out.job_id)


DEVHOST_SUBSET = ["csv-empty", "csv-truncated-row", "csv-wrong-type", "csv-ragged", "csv-huge-line", "csv-bom",
                  "csv-utf16", "csv-crlf", "archive-zip", "manifest-ok", "manifest-unknown-payload",
                  "manifest-extra-field", "manifest-alias-bomb", "manifest-python-tag", "manifest-json-invalid",
                  "manifest-grid-over-limit", "name-tab", "name-too-long"]


def test_devhost_quarantines_and_keeps_running(store: Storage, azurite, tmp_path, monkeypatch):
    """The real function_app's ingest, driven by the devhost: every entry ends rejected (with its
    error and its bytes in quarantine) or accepted, and the host's threads are all alive after."""
    from upwell.local.devhost.host import DevHost

    monkeypatch.setenv(names.CONNECTION, azurite.connection_string)
    monkeypatch.setenv("UPWELL_MAX_UPLOAD_BYTES", str(LIMITS["max_upload_bytes"]))
    monkeypatch.setenv("UPWELL_MAX_SHARDS", str(LIMITS["max_shards"]))
    monkeypatch.setenv("UPWELL_SCALE_SCHEDULE", "0 0 0 1 1 *")
    import handlers.context

    handlers.context.reset()
    cases = {c.id: c for c in CORPUS}
    prefix = f"bad-{RUN}/devhost/"
    subset = [Case(**{**cases[i].__dict__, "name": "devhost/" + cases[i].name}) for i in DEVHOST_SUBSET]
    host = DevHost("function_app:app", connection_string=azurite.connection_string,
                   host_json=Path(__file__).resolve().parents[2] / "host.json", poll_interval=0.3, port=None,
                   functions=["ingest"], host_id=f"bad-{RUN}")
    host.start()
    try:
        uploaded = [(*upload(store, azurite, c), c) for c in subset]
        ledger = Ledger(store)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            settled = [getattr(ledger.job(j), "status", None) in ("accepted", "rejected") for _, j, _ in uploaded]
            if all(settled):
                break
            time.sleep(0.5)
        for _, job_id, case in uploaded:
            check(store, job_id, case)
        assert all(t.is_alive() for t in host._threads), "a devhost thread died"
        left = [b.name for b in store.list(names.INCOMING, prefix)]
        assert left == sorted(n for n, _, c in uploaded if c.valid), "only accepted uploads stay in incoming/"
        failures = [r for r in host.invocations if r.outcome != "succeeded"]
        assert failures == [], failures
    finally:
        host.stop()
        handlers.context.reset()
