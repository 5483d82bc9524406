"""Writes to many shard rows of one job at once, for the ledger (only ``upwell.ledger`` imports it).

Rows of one job share a PartitionKey, so up to 100 of them change in one entity-group transaction (the
Table service's limit: one partition, at most 100 operations, 4 MB; learn.microsoft.com/rest/api/storageservices/
performing-entity-group-transactions). A transaction is all or nothing: when one of its conditional updates
finds its row changed (412), or a create finds its row there (409), none applies and the ledger goes one
by one for that chunk. Several transactions are in flight at once (``workers``): a job of 100,000 shards is
1,000 requests, not 100,000.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError
from azure.data.tables import TableTransactionError, UpdateMode

from upwell.rows import ShardRow

GROUP = 100  # operations per entity-group transaction


def chunks(items: list, size: int = GROUP) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def each_chunk(work: Callable[[list], Any], items: list, workers: int) -> list:
    """``work(chunk)`` for each chunk of ``items``, ``workers`` at a time; their answers in order."""
    parts = chunks(items)
    if workers <= 1 or len(parts) <= 1:
        return [work(c) for c in parts]
    with ThreadPoolExecutor(max_workers=min(workers, len(parts)), thread_name_prefix="rows") as pool:
        return list(pool.map(work, parts))


def create_or_delete(table, op: str, entities: list[dict], workers: int = 1) -> list[str]:
    """``op`` ("create" or "delete") on one partition's entities; a refused transaction goes one by one,
    leaving alone rows that exist (create) or are gone (delete). Returns each entity's new ETag, in order:
    a transaction's response carries one sub-response per operation, in the order sent, each with the
    entity's ETag header (learn.microsoft.com/rest/api/storageservices/performing-entity-group-transactions;
    azure-data-tables' ``_batch_send`` returns them as ``[{"etag": ...}, ...]``, its
    ``extract_batch_part_metadata``). "" for a row this call did not write (it existed, or a delete)."""
    def one_chunk(chunk: list[dict]) -> list[str]:
        try:
            return [str((part or {}).get("etag") or "") if op == "create" else ""
                    for part in table.submit_transaction([(op, e) for e in chunk])]
        except TableTransactionError:
            return [_one(table, op, e) for e in chunk]

    return [etag for part in each_chunk(one_chunk, entities, workers) for etag in part]


def _one(table, op: str, entity: dict) -> str:
    """``op`` on one entity, alone: its new ETag when it created the row, else ""."""
    try:
        if op == "create":
            return str((table.create_entity(entity) or {}).get("etag") or "")
        table.delete_entity(entity["PartitionKey"], entity["RowKey"])
    except (ResourceExistsError, ResourceNotFoundError):
        pass
    return ""


def merge_seen(table, changes: list[tuple[ShardRow, dict[str, Any]]], workers: int) -> list[ShardRow]:
    """Merge each ``(row, fields)``, conditional on the row's ETag as the caller read it, a transaction per
    chunk. Returns the rows of the chunks that were refused (a row changed since): none of them was written."""
    cond = {"mode": UpdateMode.MERGE, "match_condition": MatchConditions.IfNotModified}

    def one_chunk(chunk: list[tuple[ShardRow, dict]]) -> list[ShardRow]:
        ops = [("update", {"PartitionKey": r.job_id, "RowKey": r.shard_id, **f}, {**cond, "etag": r.etag})
               for r, f in chunk]
        try:
            table.submit_transaction(ops)
            return []
        except (TableTransactionError, HttpResponseError) as exc:
            if isinstance(exc, HttpResponseError) and exc.status_code not in (404, 409, 412):
                raise
            return [r for r, _ in chunk]

    return [r for refused in each_chunk(one_chunk, changes, workers) for r in refused]


def reopened(row: ShardRow, now: str) -> dict[str, Any]:
    """An ended shard's fields once it is put back to queued for a re-run: fresh attempt counters."""
    return {"status": "queued", "attempts": 0, "preemptions": 0, "deferrals": 0, "failures": 0, "error": "",
            "stderr_tail": "", "poisoned": False, "released_at": "", "node": "", "queued_at": now,
            "reruns": row.reruns + 1, "result_json": "", **({"points_failed": ""} if row.points else {})}


def cancel(ledger, job_id: str, rows: list[ShardRow], now: str, workers: int) -> int:
    """Make ``rows`` (just read, not running, not ended) cancelled under their ETags, 100 to a transaction;
    the rows of a refused chunk go one by one through ``ledger.shard_cancelled``, which reads each again.
    How many became cancelled."""
    refused = merge_seen(ledger.table, [(r, {"status": "cancelled", "cancelled_at": now}) for r in rows], workers)
    return len(rows) - len(refused) + sum(bool(ledger.shard_cancelled(job_id, r.shard_id)) for r in refused)


def reopen(ledger, job_id: str, rows: list[ShardRow], now: str, workers: int) -> dict[str, Any]:
    """Put the ended ``rows`` back to queued, 100 to a transaction; a refused chunk's rows one by one
    through ``ledger.reopen_shard``. shard id -> the state each had."""
    ended = [r for r in rows if r.terminal]
    refused = {r.shard_id for r in merge_seen(ledger.table, [(r, reopened(r, now)) for r in ended], workers)}
    was = {r.shard_id: r.status for r in ended if r.shard_id not in refused}
    for shard_id in sorted(refused):
        state = ledger.reopen_shard(job_id, shard_id)
        if state is not None:
            was[shard_id] = state
    return was
