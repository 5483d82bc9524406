"""The result document: written once to results/<job>/<shard>.json by conditional create.

A duplicate run of the same shard finds the result already there and only acks.
A permanent failure is written the same way, with status "failed", so that the
collect function counts every shard through one path.
"""

from __future__ import annotations

import json
from pathlib import Path

from upwell import names, provenance
from upwell.messages import WorkItem
from upwell.settings import Settings
from upwell.storage import Storage
from upwell.timeutil import seconds_between

SCHEMA = 1


def document(item: WorkItem, status: str, *, shard: dict, job: dict, node: dict, started: str | None,
             finished: str, settings: Settings, launch=None, input_path: Path | None = None,
             artifacts: dict[str, str] | None = None, error: str = "", stderr_tail: str = "") -> dict:
    queued = shard.get("queued_at")
    definition = dict(getattr(launch, "definition", None) or {}) or _definition_of(job)
    metrics = dict(getattr(launch, "metrics", None) or {})
    input_sha = provenance.sha256_file(input_path) if input_path else shard.get("input_sha256", "")
    return {
        "schema": SCHEMA,
        "job_id": item.job_id,
        "shard_id": item.shard_id,
        "payload": item.payload,
        "pool": item.pool,
        "status": status,
        "params": item.params,
        "metrics": metrics,
        "artifacts": artifacts or {},
        "timings": {
            "queued": queued,
            "started": started,
            "finished": finished,
            "run_s": getattr(launch, "run_s", None),
            "node_seconds": seconds_between(started, finished) if started else 0.0,
            "queue_wait_s": seconds_between(queued, shard.get("first_started_at") or started),
            "checkpoints": int(shard.get("checkpoints") or 0) + int(getattr(launch, "checkpoints", 0) or 0),
            "preemptions": int(shard.get("preemptions") or 0),
            "attempt": item.attempt,
            "resumed_from": getattr(launch, "resumed_from", None),
            "preempted_node_seconds": float(shard.get("preempted_node_seconds") or 0.0),
            "failed_node_seconds": float(shard.get("failed_node_seconds") or 0.0),
        },
        "node": node,
        "provenance": {
            "code_version": settings.code_version or provenance.code_version(),
            "image_digest": definition.get("image_digest") or settings.image_digest,
            "definition": {k: v for k, v in definition.items() if k != "report"},
            "input_sha256": input_sha,
            "manifest_hash": job.get("manifest_hash", ""),
            "params": item.params,
            "python": provenance.python(),
            "packages": provenance.packages(),
            "trace_id": item.trace_id,
        },
        "report": definition.get("report") or {},
        "error": error,
        "stderr_tail": (stderr_tail or getattr(launch, "stderr_tail", "") or "")[-4000:] if status != "succeeded"
        else "",
    }


def _definition_of(job: dict) -> dict:
    """What the job row recorded of the definition at ingest, for results written without a run
    (poisoned before the payload started)."""
    if not job.get("payload_sha256"):
        return {}
    image = str(job.get("payload_image") or "")
    return {"name": job.get("payload"), "version": job.get("payload_version"), "sha256": job["payload_sha256"],
            "image": image, "image_digest": image.rsplit("@", 1)[1] if "@" in image else ""}


def write(storage: Storage, item: WorkItem, doc: dict) -> bool:
    """Conditional create; False when a result was already there (a duplicate run)."""
    data = json.dumps(doc, indent=1, default=str).encode()
    return storage.write(f"{names.RESULTS}/{item.result_blob}", data, overwrite=False,
                         content_type="application/json")
