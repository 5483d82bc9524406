"""The Event Grid subscriptions of the blob triggers, as ``bicep/modules/events.bicep`` declares them.

On Azure one event subscription per ``source=EventGrid`` blob trigger delivers
``BlobCreated`` events to the blobs extension webhook; its subject filter, retry
policy and dead-letter container are in the Bicep. The local event publisher
reads the same template, so what runs here is what is deployed. The reader is a
few regular expressions over the template text (the IaC parser lives in a
separate venv, and the Function App package carries no Bicep); when the file is
missing the values are Event Grid's defaults, which the template also uses.

The subject filter follows Event Grid's subscription schema (learn.microsoft.com,
azure/event-grid/subscription-creation-schema): ``subjectBeginsWith`` and
``subjectEndsWith`` are a prefix and a suffix match, empty matches all, and
``isSubjectCaseSensitive`` defaults to false, so both compare without case.
The suffix is per trigger (``blobTriggers[].subjectEndsWith`` in main.bicep), and so is the endpoint
(``blobTriggers[].webhook``): ``blobs``, the blobs extension webhook of a ``source=EventGrid`` blob trigger,
or ``eventgrid``, the Event Grid extension webhook of an Event Grid trigger (``upwell.local.devhost.eventgrid``),
whose container the entry alone names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from upwell import names

BLOB_CREATED = "Microsoft.Storage.BlobCreated"
# Event Grid's own defaults (and the values events.bicep sets).
DEFAULT_MAX_ATTEMPTS = 30
DEFAULT_TTL_MINUTES = 1440
DEFAULT_SUBJECT = "/blobServices/default/containers/${t.container}/"
TRIGGER_SUFFIX = "${t.subjectEndsWith}"  # the template's per-trigger suffix, filled from main.bicep
# Delivery retry schedule of Event Grid (seconds after the previous try), then every 12 h until the TTL.
RETRY_SCHEDULE_S = (10, 30, 60, 300, 600, 1800, 3600, 10800, 21600, 43200)
# Answers Event Grid does not retry for a WebHook endpoint: dead-lettered at once.
NO_RETRY_STATUS = frozenset({400, 401, 403, 413})


@dataclass(frozen=True)
class Subscription:
    """One event subscription: which events go to which function, and how delivery is retried."""

    name: str
    function: str
    container: str
    subject_begins_with: str
    included_event_types: tuple[str, ...] = (BLOB_CREATED,)
    max_delivery_attempts: int = DEFAULT_MAX_ATTEMPTS
    ttl_minutes: int = DEFAULT_TTL_MINUTES
    dead_letter_container: str = names.EVENTGRID_DEADLETTER
    subject_ends_with: str = ""
    subject_case_sensitive: bool = False  # Event Grid's default for isSubjectCaseSensitive
    webhook: str = "blobs"  # the endpoint: "blobs" (a blob trigger's) or "eventgrid" (an Event Grid trigger's)

    def matches(self, event_type: str, subject: str) -> bool:
        """The event passes the filter: an included type, and the subject's prefix and suffix match."""
        fold = (lambda s: s) if self.subject_case_sensitive else str.casefold
        return (event_type in self.included_event_types
                and fold(subject).startswith(fold(self.subject_begins_with))
                and fold(subject).endswith(fold(self.subject_ends_with)))

    def retry_delay(self, attempt: int) -> float | None:
        """Seconds before try ``attempt + 1`` after ``attempt`` failed tries; None when none is left."""
        if attempt >= self.max_delivery_attempts:
            return None
        return float(RETRY_SCHEDULE_S[min(attempt - 1, len(RETRY_SCHEDULE_S) - 1)])


@dataclass(frozen=True)
class Template:
    """What events.bicep (and main.bicep's dead-letter variable) say; ``source`` is where it was read."""

    subject_begins_with: str = DEFAULT_SUBJECT
    subject_ends_with: str = ""
    included_event_types: tuple[str, ...] = (BLOB_CREATED,)
    max_delivery_attempts: int = DEFAULT_MAX_ATTEMPTS
    ttl_minutes: int = DEFAULT_TTL_MINUTES
    dead_letter_container: str = names.EVENTGRID_DEADLETTER
    name_template: str = "blob-${t.function}"
    source: tuple[str, ...] = field(default_factory=tuple)
    ends_with: dict[str, str] = field(default_factory=dict)  # function -> main.bicep's subjectEndsWith
    containers: dict[str, str] = field(default_factory=dict)  # function -> main.bicep's container
    webhooks: dict[str, str] = field(default_factory=dict)  # function -> main.bicep's webhook

    def subscription(self, function: str, container: str) -> Subscription:
        def fill(text: str) -> str:
            text = text.replace(TRIGGER_SUFFIX, self.ends_with.get(function, ""))
            return text.replace("${t.container}", container).replace("${t.function}", function)
        return Subscription(fill(self.name_template), function, container, fill(self.subject_begins_with),
                            self.included_event_types, self.max_delivery_attempts, self.ttl_minutes,
                            self.dead_letter_container, fill(self.subject_ends_with),
                            webhook=self.webhooks.get(function, "blobs"))


def _trigger_entries(main_text: str) -> dict[str, dict[str, str]]:
    """function -> its entry of main.bicep's ``blobTriggers`` (container, subjectEndsWith, webhook)."""
    block = re.search(r"var blobTriggers = \[(.*?)\n\]", main_text, re.S)
    entries = re.findall(r"\{(.*?)\}", block[1], re.S) if block else []
    found = {}
    for entry in entries:
        function = _one(r"function:\s*'([^']*)'", entry)
        if function:
            found[function] = {key: _one(rf"{key}:\s*'([^']*)'", entry) or ""
                               for key in ("container", "subjectEndsWith", "webhook")}
    return found


def _one(pattern: str, text: str) -> str | None:
    found = re.search(pattern, text)
    return found[1] if found else None


def read_template(script_root: Path) -> Template:
    """The subscription template from ``<script_root>/bicep``; Event Grid's defaults when it is absent."""
    events, main = script_root / "bicep" / "modules" / "events.bicep", script_root / "bicep" / "main.bicep"
    if not events.exists():
        return Template()
    text = events.read_text()
    types = re.search(r"includedEventTypes:\s*\[(.*?)\]", text, re.S)
    dead_letter, entries = names.EVENTGRID_DEADLETTER, {}
    if main.exists():
        main_text = main.read_text()
        dead_letter = _one(r"var deadLetterContainerName = '([^']+)'", main_text) or dead_letter
        entries = _trigger_entries(main_text)
    ends_with = TRIGGER_SUFFIX if re.search(r"subjectEndsWith:\s*t\.subjectEndsWith\b", text) else ""
    return Template(
        subject_begins_with=_one(r"subjectBeginsWith:\s*'([^']*)'", text) or DEFAULT_SUBJECT,
        subject_ends_with=ends_with or _one(r"subjectEndsWith:\s*'([^']*)'", text) or "",
        included_event_types=tuple(re.findall(r"'([^']+)'", types[1])) if types else (BLOB_CREATED,),
        max_delivery_attempts=int(_one(r"maxDeliveryAttempts:\s*(\d+)", text) or DEFAULT_MAX_ATTEMPTS),
        ttl_minutes=int(_one(r"eventTimeToLiveInMinutes:\s*(\d+)", text) or DEFAULT_TTL_MINUTES),
        dead_letter_container=dead_letter,
        name_template=_one(r"name:\s*'(blob-[^']*)'", text) or "blob-${t.function}",
        source=(str(events), str(main)),
        ends_with={f: e["subjectEndsWith"] for f, e in entries.items()},
        containers={f: e["container"] for f, e in entries.items() if e["container"]},
        webhooks={f: e["webhook"] or "blobs" for f, e in entries.items()},
    )
