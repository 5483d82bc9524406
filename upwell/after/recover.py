"""The after-job steps a crash left half done, found and completed by the reconciler (upwell.ops.reconcile).

Each step writes its claim on the job row before its effect (``upwell.after.state``), so a crash between
the two leaves a trace that nothing else would act on again (the job-done transition sees the claim and
moves on):

* ``lost_reduce``: the analysis is ``running`` for attempt n, and the reduce job ``<job>-reduce<n>`` has
  no row, or a row whose acceptance stopped (``ingesting`` with a lapsed ingest lease). The reduce job is
  accepted again under the same id: the acceptor takes over a row left behind and sends only what was not
  sent (``upwell.ingest.accept``), and a reduce job that exists and moves on is left alone.
* ``unqueued_event``: an event is claimed (``notify_sent``) but was never marked queued
  (``notify_queued``) nor delivered. Its message is sent again. If the crash came after the send and
  before the mark, that is one more copy of the event, with the same CloudEvents ``id``
  (``upwell.after.cloudevents``): a receiver drops it by that id, and ``deliver`` skips an event the job
  row already records as delivered. Followed: the CloudEvents 1.0.2 specification's ``id`` attribute
  (cloudevents/spec, ``cloudevents/spec.md``): "If a duplicate event is re-sent (e.g. due to a network
  error) it MAY have the same id. Consumers MAY assume that Events with identical source and id are
  duplicates."

A trace younger than the reconciler's grace is left alone (the caller may still be between the two
writes) and looked at again next pass. Completing one is idempotent, so a second pass does nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from upwell.after import notify, reduce, state
from upwell.after.spec import of_job
from upwell.ledger import Ledger
from upwell.results.publish import publish
from upwell.rows import JobRow
from upwell.settings import Settings
from upwell.storage import Storage

LOST_REDUCE, UNQUEUED_EVENT = "lost_reduce", "unqueued_event"


@dataclass(frozen=True)
class Trace:
    """One half-done step of one job: ``young`` while it is within the grace (left for the next pass)."""

    kind: str
    job_id: str
    detail: str
    young: bool


def find(ledger: Ledger, settings: Settings, job: JobRow, now: float) -> list[Trace]:
    """The half-done after-job steps of ``job`` (a row just read); one point read when its analysis runs."""
    out = []
    reduce_id = reduce.lost(ledger, settings, job, now, young=True)
    if reduce_id:
        out.append(Trace(LOST_REDUCE, job.job_id, reduce_id, _young(job, "analysis_at", settings, now)))
    done = set(state.listed(job, "notify_queued")) | set(state.listed(job, "notify_delivered"))
    unqueued = [e for e in state.listed(job, "notify_sent") if e not in done]
    if unqueued:
        out.append(Trace(UNQUEUED_EVENT, job.job_id, ",".join(unqueued), _young(job, "notify_at", settings, now)))
    return out


def complete(storage: Storage, settings: Settings, ledger: Ledger, trace: Trace) -> str:
    """Finish the step ``trace`` names, from the job row as it is now; what was done."""
    job = ledger.job(trace.job_id)
    if job is None:
        return "the job is gone"
    if trace.kind == LOST_REDUCE:
        return _start_again(storage, settings, ledger, job, trace.detail)
    done = set(state.listed(job, "notify_queued")) | set(state.listed(job, "notify_delivered"))
    events = [e for e in trace.detail.split(",") if e and e not in done]
    return f"queued {','.join(notify.send(storage, ledger, job.job_id, events)) or 'nothing'}"


def _start_again(storage: Storage, settings: Settings, ledger: Ledger, job: JobRow, reduce_id: str) -> str:
    """Accept the lost reduce job again; one that cannot start ends the analysis as failed, and a report
    built meanwhile (it said "running") is built again to say why. An unreported job's report, still to
    come, runs the job-done transition itself: it is never forced here."""
    if state.field(job, "analysis_job") != reduce_id or state.field(job, "analysis_state") != state.RUNNING:
        return "the analysis moved on"
    spec = of_job(job).reduce
    if spec is None:
        state.end_analysis(ledger, job.job_id, reduce_id, False, "the job's reduce: no longer readable")
    else:
        reduce.start(storage, settings, ledger, job, spec, reduce_id)
    now = ledger.job(job.job_id)
    if now is None or state.field(now, "analysis_state") != state.FAILED:
        return f"{reduce_id} accepted again"
    if now.reported:
        publish(storage, job.job_id, ledger, force=True, settings=settings)
    return f"{reduce_id} could not start: {state.field(now, 'analysis_error')[:200]}"


def _young(job: JobRow, claimed: str, settings: Settings, now: float) -> bool:
    """Whether the claim ``claimed`` is within the grace: its caller may still be between the two writes."""
    return now - state.stamp(job, claimed) < settings.reconcile_grace_s
