"""A job event as a CloudEvent 1.0 in the JSON format, and the check of its required attributes.

Followed: the CloudEvents 1.0.2 specification (cloudevents/spec, ``cloudevents/spec.md``): the REQUIRED
context attributes are ``id``, ``source`` (a URI-reference), ``specversion`` ("1.0") and ``type``; the
OPTIONAL ones used here are ``subject``, ``time`` (RFC 3339) and ``datacontenttype``; ``source`` + ``id``
is unique per distinct event, so a receiver can drop a redelivery. The JSON format (``json-format.md``)
puts the attributes and ``data`` side by side in one object; over HTTP in structured mode
(``http-protocol-binding.md``) the body has the media type ``application/cloudevents+json``.
Event Grid custom topics take the same object (its "CloudEvents v1.0 schema" input).
"""

from __future__ import annotations

import re
from typing import Any

from upwell.timeutil import now_iso

SPEC_VERSION = "1.0"
REQUIRED = ("id", "source", "specversion", "type")
MEDIA_TYPE = "application/cloudevents+json; charset=utf-8"
TYPE_PREFIX = "io.upwell.job."
_URI_REFERENCE = re.compile(r"^[^\s]+$")


def job_event(event: str, job_id: str, project: str, data: dict[str, Any]) -> dict[str, Any]:
    """The CloudEvent of ``event`` (completed, failed, budget_exceeded, quarantined) about one job. Its id
    is derived from the job and the event, so every delivery of it carries the same id."""
    return {"specversion": SPEC_VERSION, "id": f"{job_id}.{event}", "source": f"/upwell/{project or 'default'}",
            "type": f"{TYPE_PREFIX}{event}", "subject": f"jobs/{job_id}", "time": now_iso(),
            "datacontenttype": "application/json", "data": data}


def problems(event: Any) -> list[str]:
    """What makes ``event`` not a valid CloudEvent 1.0 (empty when it is one)."""
    if not isinstance(event, dict):
        return ["a CloudEvent is a JSON object"]
    out = [f"missing required attribute {a!r}" for a in REQUIRED if not event.get(a)]
    out += [f"attribute {a!r} must be a string" for a in REQUIRED if a in event and not isinstance(event[a], str)]
    if event.get("specversion") not in (None, SPEC_VERSION):
        out.append(f"specversion is {event.get('specversion')!r}, not {SPEC_VERSION!r}")
    if isinstance(event.get("source"), str) and not _URI_REFERENCE.match(event["source"]):
        out.append("source must be a URI-reference")
    for name in event:
        if name != "data" and not re.fullmatch(r"[a-z0-9]{1,20}", name):
            out.append(f"attribute name {name!r} must be lower-case letters and digits")
    return out
