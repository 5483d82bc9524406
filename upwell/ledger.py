"""The ledger: Table `jobs`, one job row (RowKey "job") and one row per shard.

Every write that two workers can race on is ETag-conditional. A shard's final
transition and the job's counters change in ONE entity-group transaction (they
share the PartitionKey), so a shard is counted exactly once and exactly one
caller sees the job become terminal.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.data.tables import TableTransactionError, UpdateMode

from upwell import names
from upwell.errors import TransientError
from upwell.storage import Storage, translate
from upwell.timeutil import now_iso

# "cancelled" is terminal for a shard (a redelivery only acks it) but not for the job: a cancelled
# job keeps status "cancelled" and is never dispatched again unless re-run.
TERMINAL_SHARD = ("succeeded", "failed", "cancelled")
TERMINAL_JOB = ("succeeded", "partially_failed", "failed", "rejected")
_RETRIES = 20


@dataclass(frozen=True)
class Completion:
    """What finishing one shard did to its job."""

    counted: bool  # False: the shard was already terminal (a duplicate)
    job_done: bool  # True for exactly one caller per job
    job_status: str



def _written(entity: Any) -> str:
    """The server's last-write time of an entity, as a sortable string."""
    stamp = (getattr(entity, "metadata", None) or {}).get("timestamp")
    return stamp.isoformat(timespec="microseconds") if hasattr(stamp, "isoformat") else str(stamp or "")


def _conflict(exc: Exception) -> bool:
    if isinstance(exc, ResourceModifiedError | TableTransactionError):
        return True
    return isinstance(exc, HttpResponseError) and exc.status_code in (409, 412)


def _history(row: dict, status: str, keep: int = 20) -> str:
    """The shard's earlier attempts (JSON), with the one ending now appended: node, started, finished, status."""
    try:
        past = json.loads(row.get("history") or "[]")
    except ValueError:
        past = []
    past.append({"node": row.get("node", ""), "started": row.get("started_at", ""), "finished": now_iso(),
                 "status": status})
    return json.dumps(past[-keep:])


class Ledger:
    """Reads and writes job and shard rows. Keeps only a TableClient."""

    def __init__(self, storage: Storage):
        self.table = storage.table(names.JOBS_TABLE)

    # -- reads -----------------------------------------------------------------
    def job(self, job_id: str) -> dict | None:
        try:
            return dict(self.table.get_entity(job_id, names.JOB_ROW))
        except ResourceNotFoundError:
            return None
        except AzureError as exc:
            raise translate(exc, f"read job {job_id}") from None

    def shard(self, job_id: str, shard_id: str) -> dict | None:
        try:
            return dict(self.table.get_entity(job_id, shard_id))
        except ResourceNotFoundError:
            return None
        except AzureError as exc:
            raise translate(exc, f"read shard {job_id}/{shard_id}") from None

    def shards(self, job_id: str) -> list[dict]:
        rows = self.table.query_entities("PartitionKey eq @pk and RowKey ne @job",
                                         parameters={"pk": job_id, "job": names.JOB_ROW})
        return [dict(r) for r in rows]

    def jobs(self, *statuses: str) -> Iterator[dict]:
        flt = "RowKey eq @job"
        params: dict[str, Any] = {"job": names.JOB_ROW}
        if statuses:
            ors = " or ".join(f"status eq @s{i}" for i in range(len(statuses)))
            flt += f" and ( {ors} )"  # the SDK needs a space after a @parameter
            params.update({f"s{i}": s for i, s in enumerate(statuses)})
        for row in self.table.query_entities(flt, parameters=params):
            yield dict(row)

    def active_shards(self, job_id: str) -> list[tuple[str, str]]:
        """(server write time, shard id) of the job's shards that an agent is working on now:
        running and not yet released (see shard_released). The per-job concurrency cap counts these."""
        rows = self.table.query_entities("PartitionKey eq @pk and status eq @s",
                                         parameters={"pk": job_id, "s": "running"})
        return [(_written(r), r["RowKey"]) for r in rows if not r.get("released_at")]

    def running(self, pool: str) -> list[dict]:
        """Shard rows that are running on a pool (the ledger's in-flight count)."""
        rows = self.table.query_entities("status eq @s and pool eq @p", parameters={"s": "running", "p": pool})
        return [dict(r) for r in rows]

    # -- creation --------------------------------------------------------------
    def create_job(self, row: dict) -> tuple[dict, bool]:
        """Create the job row; if it exists (a redelivery), return the existing one."""
        entity = {"PartitionKey": row["job_id"], "RowKey": names.JOB_ROW, **row}
        try:
            self.table.create_entity(entity)
            return entity, True
        except ResourceExistsError:
            return self.job(row["job_id"]) or entity, False
        except AzureError as exc:
            raise translate(exc, "create job") from None

    def add_shards(self, job_id: str, rows: list[dict]) -> None:
        """Create shard rows in transactions of 100; rows that exist are left alone."""
        for start in range(0, len(rows), 100):
            chunk = [{"PartitionKey": job_id, "RowKey": r["shard_id"], **r} for r in rows[start:start + 100]]
            try:
                self.table.submit_transaction([("create", e) for e in chunk])
            except TableTransactionError:
                for e in chunk:
                    try:
                        self.table.create_entity(e)
                    except ResourceExistsError:
                        pass

    # -- transitions -----------------------------------------------------------
    def update_job(self, job_id: str, **fields: Any) -> None:
        self.table.update_entity({"PartitionKey": job_id, "RowKey": names.JOB_ROW, **fields}, mode=UpdateMode.MERGE)

    def _update_shard(self, job_id: str, shard_id: str, change) -> dict | None:
        """Apply change(row) -> fields | None under ETag; None means leave as is."""
        for _ in range(_RETRIES):
            try:
                entity = self.table.get_entity(job_id, shard_id)
            except ResourceNotFoundError:
                return None
            fields = change(dict(entity))
            if fields is None:
                return None
            try:
                self.table.update_entity({"PartitionKey": job_id, "RowKey": shard_id, **fields},
                                         mode=UpdateMode.MERGE, etag=entity.metadata["etag"],
                                         match_condition=MatchConditions.IfNotModified)
                return fields
            except (ResourceModifiedError, HttpResponseError) as exc:
                if not _conflict(exc):
                    raise translate(exc, "update shard") from None
        raise TransientError(f"shard {job_id}/{shard_id}: too much contention")

    def shard_started(self, job_id: str, shard_id: str, *, node: str, pool: str, attempt: int,
                      spot: bool = False) -> bool:
        """Mark a shard running; False if it is already terminal (a duplicate delivery)."""
        def change(row):
            if row.get("status") in TERMINAL_SHARD:
                return None
            return {"status": "running", "node": node, "pool": pool, "spot": spot, "attempts": attempt,
                    "started_at": now_iso(), "first_started_at": row.get("first_started_at") or now_iso(),
                    "released_at": ""}

        started = self._update_shard(job_id, shard_id, change) is not None
        if started:
            self._job_running(job_id)
        return started

    def _job_running(self, job_id: str) -> None:
        try:
            entity = self.table.get_entity(job_id, names.JOB_ROW)
        except ResourceNotFoundError:
            return
        if entity.get("status") != "accepted":
            return
        try:
            self.table.update_entity({"PartitionKey": job_id, "RowKey": names.JOB_ROW, "status": "running",
                                      "started_at": now_iso()}, mode=UpdateMode.MERGE,
                                     etag=entity.metadata["etag"], match_condition=MatchConditions.IfNotModified)
        except (ResourceModifiedError, HttpResponseError):
            pass  # someone else moved it on

    def shard_preempted(self, job_id: str, shard_id: str, *, checkpoints: int, node_seconds: float) -> None:
        def change(row):
            if row.get("status") in TERMINAL_SHARD:
                return None
            return {"status": "preempted", "preemptions": int(row.get("preemptions") or 0) + 1,
                    "history": _history(row, "preempted"),
                    "checkpoints": int(row.get("checkpoints") or 0) + checkpoints,
                    "preempted_node_seconds": float(row.get("preempted_node_seconds") or 0) + node_seconds}

        self._update_shard(job_id, shard_id, change)

    def shard_deferred(self, job_id: str, shard_id: str, *, node: str = "") -> None:
        """Count a delivery that was put back because the job is at its concurrency cap (not a
        failure). With ``node``: this node had marked it running, so it goes back to queued."""
        def change(row):
            if row.get("status") in TERMINAL_SHARD:
                return None
            fields: dict[str, Any] = {"deferrals": int(row.get("deferrals") or 0) + 1}
            if node and row.get("status") == "running" and row.get("node") == node:
                fields["status"] = "queued"
            return fields

        self._update_shard(job_id, shard_id, change)

    def shard_released(self, job_id: str, shard_id: str) -> None:
        """The agent is done with the shard (its result is written); collect will make it terminal."""
        def change(row):
            if row.get("status") != "running":
                return None
            return {"released_at": now_iso()}

        self._update_shard(job_id, shard_id, change)

    def shard_retry(self, job_id: str, shard_id: str, *, error: str, stderr_tail: str,
                    node_seconds: float) -> None:
        def change(row):
            if row.get("status") in TERMINAL_SHARD:
                return None
            return {"status": "queued", "error": error[:2000], "stderr_tail": stderr_tail[-4000:],
                    "history": _history(row, "failed"),
                    "failures": int(row.get("failures") or 0) + 1,
                    "failed_node_seconds": float(row.get("failed_node_seconds") or 0) + node_seconds}

        self._update_shard(job_id, shard_id, change)

    def shard_cancelled(self, job_id: str, shard_id: str, *, node: str = "", checkpoints: int = 0) -> bool:
        """Make a shard "cancelled" (its job was cancelled). With ``node``: only while that node runs it."""
        def change(row):
            if row.get("status") in TERMINAL_SHARD:
                return None
            if node and (row.get("status") != "running" or row.get("node") != node):
                return None
            fields: dict[str, Any] = {"status": "cancelled", "cancelled_at": now_iso()}
            if row.get("status") == "running":
                fields["history"] = _history(row, "cancelled")
                fields["checkpoints"] = int(row.get("checkpoints") or 0) + checkpoints
            return fields

        return self._update_shard(job_id, shard_id, change) is not None

    def reopen_shard(self, job_id: str, shard_id: str) -> str | None:
        """Put a terminal shard back to queued for a re-run; returns the status it had (None: not terminal)."""
        was: list[str] = []

        def change(row):
            if row.get("status") not in TERMINAL_SHARD:
                return None
            was[:] = [row["status"]]
            return {"status": "queued", "attempts": 0, "preemptions": 0, "deferrals": 0, "failures": 0,
                    "error": "", "stderr_tail": "", "poisoned": False, "released_at": "", "node": "",
                    "queued_at": now_iso(), "reruns": int(row.get("reruns") or 0) + 1}

        return was[0] if self._update_shard(job_id, shard_id, change) is not None else None

    def change_job(self, job_id: str, change) -> dict | None:
        """Apply change(row) -> fields | None to the job row under ETag, retrying on conflicts."""
        for _ in range(_RETRIES):
            try:
                entity = self.table.get_entity(job_id, names.JOB_ROW)
            except ResourceNotFoundError:
                return None
            fields = change(dict(entity))
            if fields is None:
                return None
            try:
                self.table.update_entity({"PartitionKey": job_id, "RowKey": names.JOB_ROW, **fields},
                                         mode=UpdateMode.MERGE, etag=entity.metadata["etag"],
                                         match_condition=MatchConditions.IfNotModified)
                return fields
            except (ResourceModifiedError, HttpResponseError) as exc:
                if not _conflict(exc):
                    raise translate(exc, "update job") from None
        raise TransientError(f"job {job_id}: too much contention")

    def delete_job(self, job_id: str) -> int:
        """Delete the job row and every shard row; returns how many rows went."""
        rows = list(self.table.query_entities("PartitionKey eq @pk", parameters={"pk": job_id},
                                              select=["PartitionKey", "RowKey"]))
        for start in range(0, len(rows), 100):
            ops = [("delete", {"PartitionKey": job_id, "RowKey": r["RowKey"]}) for r in rows[start:start + 100]]
            try:
                self.table.submit_transaction(ops)
            except TableTransactionError:
                for _, e in ops:
                    self.table.delete_entity(e["PartitionKey"], e["RowKey"])
        return len(rows)

    def finish_shard(self, job_id: str, shard_id: str, status: str, fields: dict, *,
                     cost_usd: float = 0.0) -> Completion:
        """Make a shard terminal and count it on the job row, atomically."""
        assert status in TERMINAL_SHARD
        for _ in range(_RETRIES):
            try:
                shard = self.table.get_entity(job_id, shard_id)
                job = self.table.get_entity(job_id, names.JOB_ROW)
            except ResourceNotFoundError:
                return Completion(False, False, "")
            if shard.get("status") in TERMINAL_SHARD:
                return Completion(False, False, job.get("status", ""))
            done = int(job.get("shards_done") or 0) + (status == "succeeded")
            failed = int(job.get("shards_failed") or 0) + (status == "failed")
            total = int(job.get("shards_total") or 0)
            job_fields: dict[str, Any] = {"shards_done": done, "shards_failed": failed,
                                          "spent_usd": float(job.get("spent_usd") or 0.0) + cost_usd}
            job_done = done + failed >= total and job.get("status") not in TERMINAL_JOB
            if job_done:
                job_fields["status"] = "succeeded" if failed == 0 else ("failed" if done == 0 else "partially_failed")
                job_fields["finished_at"] = now_iso()
            ops = [
                ("update", {"PartitionKey": job_id, "RowKey": shard_id, "status": status, **fields},
                 {"mode": UpdateMode.MERGE, "etag": shard.metadata["etag"],
                  "match_condition": MatchConditions.IfNotModified}),
                ("update", {"PartitionKey": job_id, "RowKey": names.JOB_ROW, **job_fields},
                 {"mode": UpdateMode.MERGE, "etag": job.metadata["etag"],
                  "match_condition": MatchConditions.IfNotModified}),
            ]
            try:
                self.table.submit_transaction(ops)
                return Completion(True, job_done, job_fields.get("status", job.get("status", "")))
            except (TableTransactionError, ResourceModifiedError, HttpResponseError) as exc:
                if not _conflict(exc):
                    raise translate(exc, "finish shard") from None
                time.sleep(0.01)
        raise TransientError(f"job {job_id}: too much contention finishing {shard_id}")

    def claim_report(self, job_id: str, lease_s: float = 300.0) -> bool:
        """Claim the right to build the report; exactly one claimant wins per lease period."""
        try:
            job = self.table.get_entity(job_id, names.JOB_ROW)
        except ResourceNotFoundError:
            return False
        if job.get("reported") or job.get("status") not in TERMINAL_JOB or job.get("status") == "rejected":
            return False
        claimed = float(job.get("report_claimed") or 0)
        if claimed and time.time() - claimed < lease_s:
            return False
        try:
            self.table.update_entity({"PartitionKey": job_id, "RowKey": names.JOB_ROW,
                                      "report_claimed": time.time()}, mode=UpdateMode.MERGE,
                                     etag=job.metadata["etag"], match_condition=MatchConditions.IfNotModified)
            return True
        except (ResourceModifiedError, HttpResponseError) as exc:
            if _conflict(exc):
                return False
            raise translate(exc, "claim report") from None
