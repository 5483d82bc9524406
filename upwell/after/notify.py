"""Notifications: which events a finished job owes, queued once each (``enqueue``, from the job-done
transition), and the delivery of one (``deliver``, the ``notify`` queue function): a signed webhook
(``upwell.after.webhook``) and, where configured, the Event Grid custom topic (``upwell.after.eventgrid``).

A delivery never touches the job's own state beyond two fields: ``notify_delivered`` (the events
delivered) and ``notify_failed`` (what failed for good, shown by ``upwell status`` and the dashboard).
Nothing a receiver does fails the job, its report or its chain.
"""

from __future__ import annotations

import json

from upwell import logs, names
from upwell.after import eventgrid, secrets, state, webhook
from upwell.after.cloudevents import job_event, problems
from upwell.after.spec import NotifySpec, of_job
from upwell.errors import ConfigError, DeliveryFailed, UpwellError
from upwell.ledger import JobState, Ledger
from upwell.rows import JobRow
from upwell.settings import Settings
from upwell.storage import Storage

log = logs.get("upwell.after.notify")
_BY_STATUS = {JobState.SUCCEEDED: "completed", JobState.FAILED: "failed", JobState.PARTIALLY_FAILED: "failed",
              JobState.REJECTED: "quarantined"}


def events_for(job: JobRow) -> list[str]:
    """The events a job's end means: completed, failed or quarantined, and budget_exceeded besides when the
    job spent its budget or was stopped for it."""
    out = [_BY_STATUS[job.status]] if job.status in _BY_STATUS else []
    if job.over_budget or "budget" in (job.killed_reason or "").lower():
        out.append("budget_exceeded")
    return out


def enqueue(storage: Storage, ledger: Ledger, job: JobRow, ask: NotifySpec | None) -> list[str]:
    """Queue one message per event the job owes and its manifest asked for, each once (the job row's
    ``notify_sent`` under its ETag); the events queued by this call."""
    if ask is None:
        return []
    wanted = [e for e in events_for(job) if e in ask.events]
    queued = state.claim_events(ledger, job.job_id, wanted) if wanted else []
    return send(storage, ledger, job.job_id, queued)


def send(storage: Storage, ledger: Ledger, job_id: str, events: list[str]) -> list[str]:
    """Put one message per claimed event on the ``notify`` queue, then mark them queued; ``events``. A crash
    before the mark leaves them claimed and unqueued, which the reconciler sends again (upwell.after.recover):
    at most one more copy of an event, with the same CloudEvents ``id``."""
    for event in events:
        storage.send(names.NOTIFY_QUEUE, json.dumps({"job_id": job_id, "event": event}))
    if events:
        state.mark_queued(ledger, job_id, events)
    return events


def summary(job: JobRow) -> dict:
    """The event's data: the job's outcome in a few fields, and where its report is."""
    return {"job_id": job.job_id, "name": job.name, "status": job.status.value, "payload": job.payload,
            "owner": job.owner, "project": job.project, "shards_total": job.shards_total,
            "shards_done": job.shards_done, "shards_failed": job.shards_failed, "spent_usd": round(job.spent_usd, 6),
            "budget_usd": job.budget_usd, "created_at": job.created_at, "finished_at": job.finished_at,
            "message": job.message, "report": f"{names.REPORTS}/{job.job_id}/index.html",
            "summary": f"{names.REPORTS}/{job.job_id}/summary.json"}


def deliver(storage: Storage, settings: Settings, job_id: str, event: str, ledger: Ledger | None = None) -> bool:
    """Deliver one queued event to every target the job asked for; True when all took it. A target that
    fails for good is recorded on the job row (``notify_failed``) and logged; nothing is raised."""
    ledger = ledger or Ledger(storage)
    job = ledger.job(job_id)
    ask = of_job(job).notify if job is not None else None
    if job is None or ask is None:
        return False
    if event in state.listed(job, "notify_delivered"):
        return True  # a re-queued copy of an event delivered already: receivers would drop it by its id
    ce = job_event(event, job_id, job.project, summary(job))
    broken = problems(ce)  # never sent: a receiver, and Event Grid, would refuse it anyway
    failed = [f"not a CloudEvent: {'; '.join(broken)}"] if broken else \
        [f for f in (_webhook(ask, ce, settings), _eventgrid(ask, ce, settings)) if f]
    bound = log.bind(job_id=job_id, event=event)
    if failed:
        bound.warning("notify.failed", error="; ".join(failed)[:500])
        state.set_fields(ledger, job_id, notify_failed=f"notification failed: {event}: {'; '.join(failed)}"[:2000])
        return False
    delivered = state.listed(job, "notify_delivered")
    state.set_fields(ledger, job_id, notify_delivered=",".join(dict.fromkeys([*delivered, event])))
    bound.info("notify.delivered")
    return True


def _webhook(ask: NotifySpec, event: dict, settings: Settings) -> str:
    """Deliver to the webhook; what failed, or ""."""
    if ask.webhook is None:
        return ""
    policy = webhook.Policy(settings.notify_attempts, settings.notify_backoff_s, settings.notify_timeout_s)
    try:
        webhook.deliver(ask.webhook.url, event, secrets.secret(ask.webhook.secret, settings), policy)
    except (DeliveryFailed, ConfigError) as exc:
        return f"webhook {str(exc)[:400]}"
    return ""


def _eventgrid(ask: NotifySpec, event: dict, settings: Settings) -> str:
    """Publish to the Event Grid topic where one is configured; what failed, or ""."""
    if not ask.eventgrid or not settings.eventgrid_endpoint:
        return ""
    try:
        eventgrid.publish(settings.eventgrid_endpoint, event)
    except DeliveryFailed as exc:
        return f"Event Grid {str(exc)[:400]}"
    return ""


def quarantined(storage: Storage, ledger: Ledger, job_id: str, name: str) -> list[str]:
    """A manifest was refused and quarantined: if its ``notify:`` block alone still reads as valid (the
    manifest may be bad elsewhere), record it on the rejected job and queue ``quarantined``; the events
    queued. Best effort: a notification never changes what the ingest did."""
    from upwell.documents import parse_document
    from upwell.ingest.blobnames import is_manifest

    job = ledger.job(job_id)
    if not is_manifest(name) or job is None or not job.quarantine_blob:
        return []
    try:  # the copy in quarantine/: the original is gone by now
        doc = parse_document(storage.read(job.quarantine_blob), name)
        ask = NotifySpec.model_validate(doc.get("notify")) if isinstance(doc.get("notify"), dict) else None
        if ask is None:
            return []
        state.set_fields(ledger, job_id, after_notify=ask.model_dump_json())
        return enqueue(storage, ledger, job, ask)
    except (UpwellError, ValueError) as exc:  # an unreadable manifest has asked for nothing we can read
        log.info("notify.quarantine_unread", job_id=job_id, error=str(exc)[:200])
        return []
