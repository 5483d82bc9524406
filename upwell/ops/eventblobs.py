"""The blobs that a dead-lettered Event Grid event or a poisoned blob-trigger message names (the reconciler's
``dead_letters`` and ``poison`` steps re-drive them).

An Event Grid blob event names its blob in ``subject``: ``/blobServices/default/containers/<c>/blobs/<name>``
(learn.microsoft.com/azure/event-grid/event-schema-blob-storage). A message of
``webjobs-blobtrigger-poison`` is JSON with ``ContainerName`` and ``BlobName``, plain or base64 as the host's
``messageEncoding`` wrote it.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator


def poison_text(content: str) -> str:
    """A poison message as written: plain JSON, or base64 of it (the host's messageEncoding)."""
    if content.lstrip().startswith("{"):
        return content
    try:
        return base64.b64decode(content, validate=True).decode()
    except (binascii.Error, ValueError):
        return content


def subject_blob(subject: str) -> tuple[str, str] | None:
    """(container, blob name) that an Event Grid blob event's subject names; None for any other subject."""
    _, sep, rest = str(subject or "").partition("/containers/")
    container, sep2, name = rest.partition("/blobs/")
    return (container, name) if sep and sep2 and name else None


def event_blobs(events: list) -> Iterator[tuple[str, str]]:
    """(container, blob name) of each Event Grid blob event, from its subject."""
    for event in events:
        found = subject_blob(str((event or {}).get("subject") or ""))
        if found:
            yield found
