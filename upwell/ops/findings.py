"""Table ``janitor``: the janitor's findings and what became of them, as typed rows.

The one module that names the table, as the ledger owns ``jobs`` and the scaling log ``scaling``.
PartitionKey is the UTC day of the pass, RowKey its time plus the finding's index, so a day's
findings list in order and a second pass never overwrites the first.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.core.exceptions import AzureError, ResourceNotFoundError

from upwell import names
from upwell.storage import storage_error
from upwell.timeutil import now_iso


@dataclass
class Finding:
    """One leaked, idle or expired resource the janitor found; ``result`` says what applying did."""

    kind: str
    resource: str  # ARM id, Batch pool or job id, or upwell job id
    name: str
    reason: str
    tagged: bool
    action: str = "report"
    tags: dict = field(default_factory=dict)
    result: str = ""  # after apply: "deleted", "skipped: ...", "failed: ..."

    def as_row(self) -> dict[str, Any]:
        row = asdict(self)
        row["tags"] = json.dumps(self.tags, sort_keys=True)
        return row


@dataclass(frozen=True)
class FindingRow:
    """A recorded finding: the finding, when it was recorded (``row_key``) and whether the pass applied."""

    row_key: str
    finding: Finding
    applied: bool

    @classmethod
    def from_entity(cls, entity: dict[str, Any]) -> FindingRow:
        try:
            tags = json.loads(entity.get("tags") or "{}")
        except ValueError:
            tags = {}
        finding = Finding(kind=str(entity.get("kind", "")), resource=str(entity.get("resource", "")),
                          name=str(entity.get("name", "")), reason=str(entity.get("reason", "")),
                          tagged=bool(entity.get("tagged", False)), action=str(entity.get("action", "report")),
                          tags=tags if isinstance(tags, dict) else {}, result=str(entity.get("result", "")))
        return cls(str(entity["RowKey"]), finding, bool(entity.get("applied", False)))


class FindingsLog:
    """Reads and writes Table janitor; every method raises only upwell errors (a missing table reads empty)."""

    def __init__(self, storage: Any) -> None:
        self.table = storage.table(names.JANITOR_TABLE)

    def record(self, findings: list[Finding], *, applied: bool) -> int:
        stamp = now_iso()
        try:
            for i, f in enumerate(findings):
                row = {k: (v if v is not None else "") for k, v in f.as_row().items()}
                self.table.upsert_entity({"PartitionKey": stamp[:10], "RowKey": f"{stamp}-{i:04d}",
                                          "applied": applied, **row})
        except AzureError as exc:
            raise storage_error(exc, "record the janitor's findings") from None
        return len(findings)

    def recent(self, limit: int = 50) -> list[FindingRow]:
        """The latest findings, newest first (today's and yesterday's partitions)."""
        today = datetime.now(UTC).date()
        rows: list[FindingRow] = []
        for day in (today, today - timedelta(days=1)):
            try:
                found = self.table.query_entities("PartitionKey eq @d", parameters={"d": day.isoformat()})
                rows += [FindingRow.from_entity(e) for e in found]
            except ResourceNotFoundError:  # no table yet: no findings
                break
            except AzureError as exc:
                raise storage_error(exc, "read the janitor's findings") from None
        return sorted(rows, key=lambda r: r.row_key, reverse=True)[:limit]
