"""Writes a blob change feed in Azure's documented layout into any account (Azurite has none of its own).

What Azure writes, per Microsoft's "Change feed support in Azure Blob Storage": the container
``$blobchangefeed``; ``idx/segments/1601/01/01/0000/meta.json`` (the empty marker written when the
feed is enabled); ``meta/segments.json`` with ``lastConsumable``; one ``idx/segments/YYYY/MM/DD/HHMM/meta.json``
per hourly segment with ``status`` and ``chunkFilePaths`` (``$blobchangefeed/log/NN/YYYY/MM/DD/HHMM/``);
and in each of those folders append blobs ``00000.avro``, ... of Avro records, appended a block at a
time. The records follow the documented event schema (version 1 fields; ``data.etag`` without quotes,
as the feed writes it). The contract tests and bench/bench_reconcile.py read it with upwell's reader.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import uuid

import fastavro

from upwell.ops.changefeed import CONTAINER, SEGMENT_ROOT, SEGMENTS_META, segment_key

EVENT_TYPES = ["BlobCreated", "BlobDeleted", "BlobPropertiesUpdated", "BlobSnapshotCreated", "Control"]
SCHEMA = fastavro.parse_schema(
    {
        "type": "record",
        "name": "BlobChangeEvent",
        "namespace": "com.microsoft.azure.storage.blob",
        "fields": [
            {"name": "schemaVersion", "type": "long"},
            {"name": "topic", "type": "string"},
            {"name": "subject", "type": "string"},
            {"name": "eventType", "type": {"type": "enum", "name": "BlobChangeEventType", "symbols": EVENT_TYPES}},
            {"name": "eventTime", "type": "string"},
            {"name": "id", "type": "string"},
            {
                "name": "data",
                "type": [
                    "null",
                    {
                        "type": "record",
                        "name": "BlobChangeEventData",
                        "fields": [
                            {"name": "api", "type": "string"},
                            {"name": "clientRequestId", "type": "string"},
                            {"name": "requestId", "type": "string"},
                            {"name": "etag", "type": "string"},
                            {"name": "contentType", "type": "string"},
                            {"name": "contentLength", "type": "long"},
                            {"name": "blobType", "type": "string"},
                            {"name": "url", "type": "string"},
                            {"name": "sequencer", "type": "string"},
                            {"name": "storageDiagnostics", "type": {"type": "map", "values": "string"}},
                        ],
                    },
                ],
            },
        ],
    }
)
TOPIC = (
    "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/rg/providers/"
    "Microsoft.Storage/storageAccounts/devstoreaccount1"
)


def hour(when: dt.datetime) -> dt.datetime:
    return when.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)


def event(
    container: str,
    name: str,
    etag: str = "0x0",
    *,
    when: dt.datetime | None = None,
    event_type: str = "BlobCreated",
    size: int = 1,
) -> dict:
    """One change event record as the feed stores it."""
    when = when or dt.datetime.now(dt.UTC)
    rid = str(uuid.uuid4())
    return {
        "schemaVersion": 1,
        "topic": TOPIC,
        "subject": f"/blobServices/default/containers/{container}/blobs/{name}",
        "eventType": event_type,
        "eventTime": when.strftime("%Y-%m-%dT%H:%M:%S.%f0Z"),
        "id": rid,
        "data": None
        if event_type == "Control"
        else {
            "api": "PutBlob",
            "clientRequestId": rid,
            "requestId": rid,
            "etag": etag.strip('"'),
            "contentType": "application/octet-stream",
            "contentLength": size,
            "blobType": "BlockBlob",
            "url": "",
            "sequencer": f"{int(when.timestamp() * 1e6):048x}",
            "storageDiagnostics": {},
        },
    }


class FeedWriter:
    """Appends records to segments the way the feed does. Keeps each chunk's bytes to append to it."""

    def __init__(self, container) -> None:
        self.container = container
        self.files: dict[str, io.BytesIO] = {}
        self.shards: dict[str, set[int]] = {}
        if not container.exists():
            container.create_container()
        self._json(f"{SEGMENT_ROOT}1601/01/01/0000/meta.json", {"version": 0, "chunkFilePaths": []})

    def _json(self, name: str, value: dict) -> None:
        self.container.get_blob_client(name).upload_blob(json.dumps(value).encode(), overwrite=True)

    def append(
        self, segment: dt.datetime, records: list[dict], *, shard: int = 0, chunk: int = 0, status: str = "Publishing"
    ) -> None:
        """Append ``records`` as one or more Avro blocks to chunk ``chunk`` of ``shard`` in the segment
        of the hour of ``segment``, and (re)write the segment's meta.json."""
        key = segment_key(hour(segment))
        path = f"log/{shard:02d}/{key}/{chunk:05d}.avro"
        buf = self.files.setdefault(path, io.BytesIO())
        before = buf.seek(0, io.SEEK_END)
        fastavro.writer(buf, SCHEMA, records, sync_interval=256)
        client = self.container.get_blob_client(path)
        if before == 0:
            client.create_append_blob()
        client.append_block(buf.getvalue()[before:])
        self.shards.setdefault(key, set()).add(shard)
        self.segment(segment, status=status)

    def segment(self, segment: dt.datetime, *, status: str = "Publishing") -> None:
        key = segment_key(hour(segment))
        shards = sorted(self.shards.get(key, ()))
        self._json(
            f"{SEGMENT_ROOT}{key}/meta.json",
            {
                "version": 0,
                "begin": hour(segment).strftime("%Y-%m-%dT%H:%M:%S.000Z"),
                "intervalSecs": 3600,
                "status": status,
                "config": {
                    "version": 0,
                    "numShards": len(shards),
                    "recordsFormat": "avro",
                    "formatSchemaVersion": 1,
                    "shardDistFnVersion": 1,
                },
                "chunkFilePaths": [f"{CONTAINER}/log/{s:02d}/{key}/" for s in shards],
            },
        )

    def consumable(self, segment: dt.datetime) -> None:
        """meta/segments.json: segments up to the hour of ``segment`` may be consumed."""
        self._json(SEGMENTS_META, {"version": 0, "lastConsumable": hour(segment).strftime("%Y-%m-%dT%H:%M:%S.000Z")})
