"""The result document: written once to results/<job>/<shard>.json by conditional create.

A duplicate run of the same shard finds the result already there and only acks.
A permanent failure is written the same way, with status "failed", so that the
collect function counts every shard through one path.
"""

from __future__ import annotations

import json
from pathlib import Path

from upwell import names, provenance
from upwell.ledger import JobRow, ShardRow
from upwell.messages import WorkItem
from upwell.settings import Settings
from upwell.storage import Storage
from upwell.timeutil import seconds_between

SCHEMA = 1


def document(item: WorkItem, status: str, *, shard: ShardRow, job: JobRow, node: dict, started: str | None,
             finished: str, settings: Settings, launch=None, input_path: Path | None = None,
             artifacts: dict[str, str] | None = None, error: str = "", stderr_tail: str = "",
             cpu_wait_s: float = 0.0) -> dict:
    """The shard's result document. ``cpu_wait_s``: time the attempt waited for a CPU on a machine that local
    nodes share; it is not node time (workers.settle.cpu_wait). ``timings.node_seconds`` is the attempt's
    time x the nodes it held (a gang holds ``item.nodes``), which the ledger sums and the cost prices."""
    queued = shard.queued_at or None
    definition = dict(getattr(launch, "definition", None) or {}) or _definition_of(job)
    metrics = dict(getattr(launch, "metrics", None) or {})
    input_sha = provenance.sha256_file(input_path) if input_path else shard.input_sha256
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
        # what the attempt's payload printed: 0 means no payload.log was kept (workers.staging.keep_log), and a
        # log left by an earlier attempt is not this one's; None: no payload ran, or it was not counted
        "log_bytes": getattr(launch, "log_bytes", None),
        "timings": {
            "queued": queued,
            "started": started,
            "finished": finished,
            "run_s": getattr(launch, "run_s", None),
            # Node time: every node of the allocation was held for the attempt (upwell.shape; 1 off a gang).
            "node_seconds": max(0.0, (seconds_between(started, finished) or 0.0) - cpu_wait_s) * _nodes(item)
            if started else 0.0,
            "nodes": _nodes(item),
            "cpu_wait_s": cpu_wait_s,
            # The payload's CPU seconds and peak RSS (workers.procs.Usage); None where not measured.
            "cpu_s": getattr(launch, "cpu_s", None),
            "max_rss_mb": getattr(launch, "max_rss_mb", None),
            "queue_wait_s": seconds_between(queued, shard.first_started_at or started),
            "checkpoints": shard.checkpoints + int(getattr(launch, "checkpoints", 0) or 0),
            "preemptions": shard.preemptions,
            "attempt": item.attempt,
            "resumed_from": getattr(launch, "resumed_from", None),
            "fresh_start": getattr(launch, "checkpoint_note", "") or "",  # a checkpoint dropped, and why
            "preempted_node_seconds": shard.preempted_node_seconds,
            "failed_node_seconds": shard.failed_node_seconds,
        },
        "node": node,
        "provenance": {
            "code_version": settings.code_version or provenance.code_version(),
            "image_digest": provenance.image_digest(definition.get("image_digest", ""), settings.image_digest),
            "tool_version": definition.get("tool_version", ""),  # the definition's version_command said
            "definition": {k: v for k, v in definition.items() if k != "report"},
            "input_sha256": input_sha,
            "manifest_hash": job.manifest_hash,
            "params": item.params,
            "python": provenance.python(),
            "packages": provenance.packages(),
            "trace_id": item.trace_id,
            "hosts": list(getattr(launch, "hosts", None) or []),  # a gang's allocation (workers.gang)
            "gpus": list(getattr(launch, "gpus", None) or []),  # the node's GPUs it was given (workers.gpus)
        },
        "report": definition.get("report") or {},
        "error": error,
        "stderr_tail": (stderr_tail or getattr(launch, "stderr_tail", "") or "")[-4000:] if status != "succeeded"
        else "",
        **({"points": block_points(item, launch, status, error)} if item.points else {}),
    }


def block_points(item: WorkItem, launch, status: str, error: str) -> list[dict]:
    """A block's points for its result (workers.blocks): each point's entry where it ran, else its parameters
    and the block's outcome (a block poisoned before it ran, or cancelled, lists every point all the same)."""
    ran = {int(e["point"]): e for e in getattr(launch, "points", None) or [] if isinstance(e, dict)}
    return [ran.get(j) or {"point": j, "params": {**item.params, **p}, "status": "not run" if status == "succeeded"
                           else status, "error": error, "metrics": {}, "artifacts": {}}
            for j, p in enumerate(item.points)]


def _nodes(item: WorkItem) -> int:
    """Nodes the attempt held: the gang's, else one."""
    return max(int(getattr(item, "nodes", 1) or 1), 1)


def _definition_of(job: JobRow) -> dict:
    """What the job row recorded of the definition at ingest, for results written without a run
    (poisoned before the payload started)."""
    if not job.payload_sha256:
        return {}
    image = job.payload_image
    return {"name": job.payload, "version": job.payload_version, "sha256": job.payload_sha256,
            "image": image, "image_digest": image.rsplit("@", 1)[1] if "@" in image else ""}


def write(storage: Storage, item: WorkItem, doc: dict) -> bool:
    """Conditional create; False when a result was already there (a duplicate run)."""
    data = json.dumps(doc, indent=1, default=str).encode()
    return storage.write(f"{names.RESULTS}/{item.result_blob}", data, overwrite=False,
                         content_type="application/json")


def note_row(doc: dict, seen: dict[str, str] | None) -> None:
    """Record in the result the shard row as the agent left it (``Hand.seen_row``), so collect can try its
    transaction on it without reading the row (upwell.results.collect; a row that has moved on since only
    fails the ETag)."""
    if seen:
        doc["shard_row"] = seen
