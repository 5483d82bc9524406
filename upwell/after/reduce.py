"""The reduce step: a job's own analysis, run once on a worker pool after its last shard is terminal.

A reduce is a job of one shard, ``<job>-reduce<n>`` for attempt n, accepted like any other (the ingest's
acceptor: its budget checks, its work item on the pool's queue, leases, retries, poison), whose input is
the directory ``results/<job>/``: every result JSON, and the artifacts that ``reduce.artifacts`` selects
(``workers.staging`` stages a prefix as a folder). Its outputs (``out/metrics.json``, figures, files)
are its result; the parent's report shows them under "Analysis" and its summary.json carries them.

Exactly once: the parent's row moves to ``analysis_state: running`` under its ETag (``state.claim_analysis``)
before the reduce job is accepted, and the reduce job's id is derived from the attempt, so a duplicate
"done" starts nothing. A reduce that fails leaves the parent "done, analysis failed" with its log;
``rerun`` starts attempt n+1 with the definition as it is registered now. A start lost to a crash after
the claim is found by the reconciler (``upwell.after.recover``), or by the next ``rerun``, and accepted
again under the same id.
"""

from __future__ import annotations

import hashlib
import json
import time
from types import SimpleNamespace

from upwell import logs, names
from upwell.after import state
from upwell.after.spec import ReduceSpec, of_job
from upwell.errors import InputRejected, NotFound, UpwellError
from upwell.ingest import lease
from upwell.ledger import JobState, Ledger
from upwell.rows import JobRow
from upwell.settings import Settings
from upwell.storage import Storage

log = logs.get("upwell.after.reduce")
SHARD = "reduce"


def begin(storage: Storage, settings: Settings, ledger: Ledger, job: JobRow, spec: ReduceSpec) -> str | None:
    """Start the job's first reduce unless one was started; the reduce job's id, or None."""
    if job.status == JobState.REJECTED or job.shards_done == 0 or state.field(job, "analysis_state"):
        return None
    reduce_id = state.claim_analysis(ledger, job.job_id)
    if reduce_id is not None:
        start(storage, settings, ledger, job, spec, reduce_id)
    return reduce_id


def rerun(storage: Storage, settings: Settings, job_id: str, ledger: Ledger | None = None) -> str:
    """``upwell rerun JOB --reduce``: the reduce alone, again, as attempt n+1; its job id."""
    ledger = ledger or Ledger(storage)
    job = ledger.job(job_id)
    spec = of_job(job).reduce if job is not None else None
    if job is None or spec is None:
        raise InputRejected(f"job {job_id} has no reduce step (its manifest names no `reduce:`)", field="reduce")
    if not job.terminal:
        raise InputRejected(f"job {job_id} is {job.status.value}: a reduce runs after its last shard",
                            field="reduce")
    reduce_id = state.claim_analysis(ledger, job_id, again=True) or lost(ledger, settings, job, time.time())
    if reduce_id is None:
        raise InputRejected(f"job {job_id}: its analysis is running already ({state.field(job, 'analysis_job')}); "
                            f"a start lost to a crash is accepted again {settings.reconcile_grace_s} s after its "
                            "claim, by the reconciler or by this command", field="reduce")
    start(storage, settings, ledger, job, spec, reduce_id)
    return reduce_id


def lost(ledger: Ledger, settings: Settings, job: JobRow, now: float, *, young: bool = False) -> str | None:
    """The reduce job of the running attempt when its start was lost (a crash between the claim and the
    acceptance): no row, or a row whose acceptance stopped (``ingesting``, its ingest lease lapsed), and a
    claim older than the reconciler's grace (``young``: however recent); else None."""
    reduce_id = state.field(job, "analysis_job")
    if state.field(job, "analysis_state") != state.RUNNING or not reduce_id:
        return None
    if not young and now - state.stamp(job, "analysis_at") < settings.reconcile_grace_s:
        return None
    child = ledger.job(reduce_id)
    if child is not None and (child.status != JobState.INGESTING or lease.live(child, now, settings.ingest_lease_s)):
        return None
    return reduce_id


def start(storage: Storage, settings: Settings, ledger: Ledger, parent: JobRow, spec: ReduceSpec,
          reduce_id: str) -> None:
    """Accept the reduce job; a reduce that cannot start (its definition, params, pool or budget) ends the
    analysis as failed with the reason instead."""
    from upwell.ingest.accept import JobAcceptor
    from upwell.ingest.manifests import Manifest, Resources
    from upwell.payloads import params as payload_params
    from upwell.payloads.registry import Registry

    bound = log.bind(job_id=parent.job_id, reduce_job=reduce_id)
    try:
        loaded = Registry(storage, settings.registry_allowlist).resolve(spec.payload)
        params = payload_params.validate(loaded.definition, dict(spec.params), where="reduce.params")
        pool = spec.pool or loaded.definition.pool
        acceptor = JobAcceptor(storage, settings, ledger)
        acceptor.check_pool(pool, "reduce.pool")
        m = Manifest.model_validate({"name": f"{parent.name or parent.job_id}: analysis"[:200],
                                     "payload": loaded.definition.name, "owner": parent.owner,
                                     "project": parent.project, "spot": parent.spot},
                                    context={"payloads": [loaded.definition.name]})
        job = acceptor.job_row(reduce_id, "", SimpleNamespace(etag="", metadata={}), m, pool,
                               "sha256:" + hashlib.sha256(spec.model_dump_json().encode()).hexdigest(), loaded)
        job.update(source_blob="", reduce_of=parent.job_id)
        d = loaded.definition.resources
        shard = (SHARD, params, f"{names.RESULTS}/{parent.job_id}/",
                 hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest())
        acceptor.accept(job, [shard], loaded, Resources(ranks=d.ranks, gpus=d.gpus), bound,
                        select=tuple(spec.artifacts))
    except UpwellError as exc:
        if not exc.permanent:
            raise
        bound.warning("reduce.not_started", error=str(exc)[:300])
        state.end_analysis(ledger, parent.job_id, reduce_id, False, f"the reduce could not start: {exc}")
        return
    bound.info("reduce.started", payload=spec.payload, pool=pool)


def finish(ledger: Ledger, job: JobRow) -> str | None:
    """A reduce job ended: record it on its parent; the parent's id when its report must show it now."""
    parent_id = state.field(job, "reduce_of")
    if not parent_id:
        return None
    ok = job.status == JobState.SUCCEEDED
    error = "" if ok else next((s.error for s in ledger.shards(job.job_id) if s.error), "the reduce failed")
    return parent_id if state.end_analysis(ledger, parent_id, job.job_id, ok, error) else None


def view(storage: Storage, job: JobRow) -> dict | None:
    """The Analysis section's data for a job's report and summary.json; None when it asked for no reduce."""
    status = state.field(job, "analysis_state")
    if not status:
        return None
    reduce_id = state.field(job, "analysis_job")
    out = {"status": status, "job_id": reduce_id, "attempt": state.attempt(job),
           "error": state.field(job, "analysis_error"), "metrics": {}, "artifacts": {},
           "log": f"{names.RESULTS}/{reduce_id}/{SHARD}/payload.log"}
    try:
        doc = json.loads(storage.read(f"{names.RESULTS}/{reduce_id}/{SHARD}.json"))
    except (NotFound, ValueError):
        return out
    if isinstance(doc, dict):
        out["metrics"] = doc.get("metrics") if isinstance(doc.get("metrics"), dict) else {}
        out["artifacts"] = doc.get("artifacts") if isinstance(doc.get("artifacts"), dict) else {}
        out["payload"] = doc.get("payload") or ""
        if doc.get("log_bytes") == 0:  # the reduce printed nothing, so it kept no log (workers.staging.keep_log)
            out["log"] = ""
    return out
