"""The job catalogue: one entity per job in partition ``catalog`` of Table `jobindex`, the ledger's (upwell.ledger).

Why it exists: the `jobs` table holds a job's row and every one of its shard rows, so a listing of job
rows that names no PartitionKey is a table scan that reads every shard row ever written, page after page
("Design for querying": a query with neither key is a table scan, learn.microsoft.com/azure/storage/tables/
table-storage-design-for-query). Listings read this catalogue instead: a query of its one partition reads
catalogue entities only, one small entity per job, never a shard row; the caller then point-reads just
the job rows it needs, or none where the catalogue's fields suffice.

This follows "Table design patterns" (learn.microsoft.com/azure/storage/tables/table-storage-design-patterns):
the *index entities pattern* and the *inter-partition secondary index pattern* (copies of the fields the
queries filter on, kept in a partition of their own, in step with the entity they index, with the
eventual-consistency caveats that page names), and the Index Table pattern's third strategy
(learn.microsoft.com/azure/architecture/patterns/index-table: a partially normalised index that repeats
the fields read most and refers to the fact row for the rest).

Why the index table (`jobindex`) and not a table of its own: the catalogue and the open/ended entries are
one index of the same jobs, written by the same ledger calls; one table keeps one owner, one role
assignment and one template resource, and no write could span the two anyway (an entity-group
transaction holds one partition only). Why one partition keyed by job id: every status write then knows
the entity's keys from the job id alone (a partition per project would need the project, and so a read,
at every status change), a unique id prefix is a RowKey range, and the backfill writes it in
entity-group transactions of 100. The cost: a listing filtered on a field (project, owner, name) is
served by a scan of this one partition, which grows with the jobs ever run, never with their shards
(a page holds up to 1,000 entities); the partition's target of 2,000 entities/s (storage scalability
targets) is far above the few writes each job makes here. Should the jobs ever run outgrow one
partition, a copy per project (the same pattern, another partition key) is the next step.

Entity: PartitionKey ``catalog``, RowKey the job id; ``project``, ``payload``, ``pool``, ``owner``,
``name``, ``source_blob``, ``created_at`` (copied once, when the job row is first written, and again
whenever a ledger write changes one of them), ``status`` and ``ended_at`` (written wherever the ledger
indexes a job status: upwell.jobindex ``moved``). ``status`` is a hint: accepted -> running is not indexed,
so a listing asked for either asks for both and every listing confirms what it returns on the job rows.

A job older than the catalogue: the reconciler's first pass after an upgrade runs ``backfill`` once (its
state row records it; docs/operate.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from azure.core.exceptions import AzureError, ResourceNotFoundError
from azure.data.tables import TableClient, UpdateMode

from upwell import names
from upwell.rows import JobRow, JobState
from upwell.storage import storage_error

PARTITION = "catalog"
ENDED_STATES = frozenset({JobState.SUCCEEDED, JobState.PARTIALLY_FAILED, JobState.FAILED, JobState.REJECTED,
                          JobState.CANCELLED})
FIELDS = ("project", "payload", "pool", "owner", "name", "source_blob", "created_at")
NOTED = (*FIELDS, "finished_at", "cancelled_at")  # the job-row fields a write carries here (the end: ended_at)
BATCH = 100  # entities per entity-group transaction (the service's limit)
_SAME = {JobState.ACCEPTED: JobState.RUNNING, JobState.RUNNING: JobState.ACCEPTED}  # not told apart here


def iso(epoch_s: float) -> str:
    """The catalogue's time text (upwell.timeutil's: sorts as it reads)."""
    return datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Listed:
    """One catalogue entity: a job as listings filter it, and when the service last wrote the entity."""

    job_id: str
    project: str = ""
    payload: str = ""
    pool: str = ""
    owner: str = ""
    name: str = ""
    source_blob: str = ""
    created_at: str = ""
    status: str = ""
    ended_at: str = ""
    written: datetime | None = None

    @classmethod
    def from_entity(cls, e: Any) -> Listed:
        return cls(str(e["RowKey"]), **{k: str(e.get(k) or "") for k in (*FIELDS, "status", "ended_at")},
                   written=getattr(e, "metadata", {}).get("timestamp"))


def _entity(row: JobRow, ended_at: str = "") -> dict[str, Any]:
    return {"PartitionKey": PARTITION, "RowKey": row.job_id, **{k: str(getattr(row, k) or "") for k in FIELDS},
            "status": row.status.value, "ended_at": ended_at}


def _any(name: str, values: Sequence[str], params: dict[str, Any]) -> str:
    """``name`` equal to one of ``values``, as OData with parameters (the SDK needs a space after each)."""
    keys = [f"{name}{len(params) + i}" for i in range(len(values))]
    params.update(zip(keys, values, strict=True))
    return "( " + " or ".join(f"{name} eq @{k}" for k in keys) + " )"


class JobCatalog:
    """Keeps only the index table's TableClient. Every SDK error leaves as an upwell error."""

    def __init__(self, table: TableClient):
        self.table = table

    # -- writes ----------------------------------------------------------------------------------
    def add(self, row: JobRow) -> None:
        """The job as its row is first written (before the row: one left without its row is mended)."""
        ended = (_ended_at(row) or iso(datetime.now(UTC).timestamp())) if row.status in ENDED_STATES else ""
        self._merge(_entity(row, ended), row.job_id)

    def note(self, job_id: str, fields: dict[str, Any], at: float | None = None) -> None:
        """Carry the catalogue's fields among ``fields`` (a job-row write) to the job's entity; ``status``
        also sets ``ended_at`` for an ended state (the row's ``finished_at`` or ``cancelled_at`` among
        ``fields``, else ``at``, epoch seconds, else now), or clears it; an end written without a status
        sets ``ended_at``. Nothing to carry: no request."""
        out = {k: str(fields[k] or "") for k in FIELDS if k in fields}
        when = str(fields.get("finished_at") or fields.get("cancelled_at") or "")  # the row's own end
        if "status" in fields:
            status = JobState(fields["status"])
            out["status"] = status.value
            out["ended_at"] = (when or iso(at or datetime.now(UTC).timestamp())) if status in ENDED_STATES else ""
        elif when:
            out["ended_at"] = when
        if out:
            self._merge({"PartitionKey": PARTITION, "RowKey": job_id, **out}, job_id)

    def forget(self, job_id: str) -> None:
        try:
            self.table.delete_entity(PARTITION, job_id)
        except ResourceNotFoundError:
            pass
        except AzureError as exc:
            raise storage_error(exc, f"drop job {job_id} from the catalogue") from None

    def _merge(self, entity: dict[str, Any], job_id: str) -> None:
        try:
            self.table.upsert_entity(entity, mode=UpdateMode.MERGE)
        except AzureError as exc:
            raise storage_error(exc, f"catalogue job {job_id}") from None

    def fill(self, rows: Iterable[JobRow], ended_at: Callable[[JobRow], str]) -> int:
        """Write the entities of ``rows`` (the backfill) in entity-group transactions of 100; how many."""
        entities = [_entity(r, ended_at(r)) for r in rows]
        try:
            for i in range(0, len(entities), BATCH):
                self.table.submit_transaction([("upsert", e, {"mode": UpdateMode.MERGE})
                                               for e in entities[i:i + BATCH]])
        except AzureError as exc:
            raise storage_error(exc, "backfill the job catalogue") from None
        return len(entities)

    # -- reads -----------------------------------------------------------------------------------
    def entries(self, *statuses: JobState | str, created_since: str | None = None,
                ended_before: datetime | None = None, **equal: str | Sequence[str]) -> list[Listed]:
        """The entities of the jobs in any of ``statuses`` (accepted and running alike), created at or
        after ``created_since`` (ISO text), ended before ``ended_before``, whose fields named in ``equal``
        hold that value (or one of those values): one query of the catalogue's partition."""
        flt, params = ["PartitionKey eq @pk"], {"pk": PARTITION}
        for name, value in equal.items():
            if name not in FIELDS:
                raise ValueError(f"catalogue: {name!r} is not a field listings filter on ({', '.join(FIELDS)})")
            values = [value] if isinstance(value, str) else list(value)
            if not values:
                return []
            flt.append(_any(name, values, params))
        if statuses:
            wanted = {JobState(s) for s in statuses}
            asked = {*wanted, *(_SAME[s] for s in wanted if s in _SAME)}
            flt.append(_any("status", sorted(s.value for s in asked), params))
        if created_since is not None:
            flt.append("created_at ge @since")
            params["since"] = created_since
        if ended_before is not None:
            flt.append("ended_at lt @ended")
            params["ended"] = iso(ended_before.timestamp())
        return self._query(" and ".join(flt), params)

    def lookup(self, prefix: str, name: str, sources: Iterable[str]) -> list[Listed]:
        """The jobs whose id starts with ``prefix``, named ``name``, or uploaded as one of ``sources``: one
        query (the id prefix a RowKey range of the partition)."""
        params: dict[str, Any] = {"pk": PARTITION, "lo": prefix, "hi": prefix[:-1] + chr(ord(prefix[-1]) + 1),
                                  "name": name}
        ors = ["( RowKey ge @lo and RowKey lt @hi )", "name eq @name", _any("source_blob", sorted(sources), params)]
        return self._query(f"PartitionKey eq @pk and ( {' or '.join(ors)} )", params)

    def _query(self, flt: str, params: dict[str, Any]) -> list[Listed]:
        try:
            return [Listed.from_entity(e) for e in self.table.query_entities(flt, parameters=params)]
        except AzureError as exc:
            raise storage_error(exc, "read the job catalogue") from None


def confirmed(job: JobRow, statuses: Sequence[JobState | str], created_since: str | None,
              equal: dict[str, str | Sequence[str]]) -> bool:
    """Whether the job row itself (the catalogue is a hint) answers the listing's filters."""
    if statuses and job.status not in {JobState(s) for s in statuses}:
        return False
    if created_since is not None and job.created_at < created_since:
        return False
    return all(getattr(job, k) in ([v] if isinstance(v, str) else list(v)) for k, v in equal.items())


def listing(catalog: JobCatalog, read: Callable[[str], JobRow | None], entries: Iterable[Listed],
            keep: Callable[[JobRow], bool] = bool, grace_s: float = 600.0, at_once: int = 1) -> Iterator[JobRow]:
    """The job rows of ``entries``, in their order, those ``keep`` confirms: each point-read (``read``) as
    the caller asks for it, ``at_once`` at a time (a caller that stops early has read at most ``at_once``
    - 1 more). An entity whose job row never came (a crash between the two writes) or was deleted is
    dropped once it is older than ``grace_s``."""
    entries = list(entries)
    with ThreadPoolExecutor(max(1, at_once), thread_name_prefix="catalog-read") as pool:
        for i in range(0, len(entries), max(1, at_once)):
            chunk = entries[i:i + max(1, at_once)]
            rows = pool.map(read, [e.job_id for e in chunk]) if len(chunk) > 1 else [read(chunk[0].job_id)]
            for entry, job in zip(chunk, rows, strict=True):
                if job is None:
                    _drop(catalog, entry, grace_s)
                elif keep(job):
                    yield job


def _drop(catalog: JobCatalog, entry: Listed, grace_s: float) -> None:
    age = (datetime.now(UTC) - entry.written).total_seconds() if entry.written else grace_s + 1
    if age > grace_s:
        catalog.forget(entry.job_id)


def backfill(jobs: TableClient, catalog: JobCatalog) -> list[JobRow]:
    """Every job row of the `jobs` table into the catalogue: the one query of `jobs` without a PartitionKey
    (a table scan), run once, after an upgrade, by the reconciler's first pass. Returns the rows read."""
    try:
        rows = [JobRow.from_entity(e) for e in jobs.query_entities("RowKey eq @job", parameters={"job": names.JOB_ROW})]
    except AzureError as exc:
        raise storage_error(exc, "read the job rows to backfill the catalogue") from None
    catalog.fill(rows, _ended_at)
    return rows


def _ended_at(row: JobRow) -> str:
    return (row.finished_at or row.cancelled_at or row.created_at) if row.status in ENDED_STATES else ""
