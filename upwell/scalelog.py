"""Table ``scaling``: the scaling log, the one module that reads and writes it, with typed rows.

The table holds three kinds of entity:

- per pool (PartitionKey = pool), RowKey ``state``: the policy state the autoscaler carries between runs,
  written only by the run that read it (an ETag claim), so two runs never act on one backlog twice;
- per pool, RowKey = ISO time: a ``DecisionRow`` the autoscaler recorded (what the reports, the dashboard and
  the janitor's idle check read);
- PartitionKey ``_reconcile``: the reconciler's state row (its watermark, cursor and re-drive counts) and
  its ``Action`` log.

The log stores the policy state as the JSON of a dict: its shape belongs to ``upwell.scale.policy``, which
this top-level module does not import (the results stage reads decisions and may not import ``scale``).
Every method raises only upwell errors (``storage_error``), except where it says a missing row is empty.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import AzureError, ResourceNotFoundError
from azure.data.tables import UpdateMode

from upwell import names
from upwell.errors import Conflict
from upwell.storage import Storage, storage_error

STATE_ROW = "state"  # the RowKey of a pool's policy state and of the reconciler's state
RECONCILE = "_reconcile"  # the reconciler's partition
TEXT_LIMIT = 4000  # an action's strings are cut to this on the way in (a property holds 64 KiB)


@dataclass(frozen=True)
class DecisionRow:
    """One recorded scaling decision of a pool; ``at`` (the RowKey) is when, as an ISO time."""

    pool: str
    at: str
    target: int = 0
    nodes: int = 0
    busy: int = 0
    visible: int = 0
    in_flight: int = 0
    reason: str = ""
    capped_by: str = ""
    spot: int = 0
    dedicated: int = 0
    message: str = ""

    @property
    def backlog(self) -> int:
        return self.visible + self.in_flight

    @classmethod
    def from_entity(cls, entity: Any) -> DecisionRow:
        """Coerces once: Table storage may hand back a missing or None property."""
        def num(key: str) -> int:
            return int(entity.get(key) or 0)

        def text(key: str) -> str:
            return str(entity.get(key) or "")

        return cls(pool=entity["PartitionKey"], at=entity["RowKey"], target=num("target"), nodes=num("nodes"),
                   busy=num("busy"), visible=num("visible"), in_flight=num("in_flight"), reason=text("reason"),
                   capped_by=text("capped_by"), spot=num("spot"), dedicated=num("dedicated"),
                   message=text("message"))

    def to_entity(self) -> dict[str, Any]:
        row = asdict(self)
        return {"PartitionKey": row.pop("pool"), "RowKey": row.pop("at"), **row}


@dataclass(frozen=True)
class Action:
    """One thing the reconciler did (or, in a dry run, would do)."""

    kind: str  # missed_upload | stuck_ingest | uncollected_result | unclosed_job | unreported_job | dead_letter |
    # poison
    target: str
    outcome: str  # redriven | quarantined | failed | requeued | closed | would_redrive | skipped
    detail: str = ""
    dry_run: bool = False
    at: str = field(default_factory=lambda: dt.datetime.now(dt.UTC).isoformat())

    @classmethod
    def from_entity(cls, entity: Any) -> Action:
        return cls(kind=str(entity.get("kind") or ""), target=str(entity.get("target") or ""),
                   outcome=str(entity.get("outcome") or ""), detail=str(entity.get("detail") or ""),
                   dry_run=bool(entity.get("dry_run")), at=str(entity.get("at") or ""))

    def to_entity(self) -> dict[str, Any]:
        # The uuid keeps two actions of one instant apart.
        row = {"PartitionKey": RECONCILE, "RowKey": f"{self.at}-{uuid.uuid4().hex[:6]}", **asdict(self)}
        return {k: (v[:TEXT_LIMIT] if isinstance(v, str) else v) for k, v in row.items()}


@dataclass(frozen=True)
class PolicyRow:
    """A pool's policy state as stored: ``state`` is {} when the row is unreadable (an older policy's);
    ``etag`` is what a claim must match."""

    pool: str
    state: dict
    etag: str


def _parsed(text: Any) -> dict:
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def fresh_reconcile_state() -> dict:
    """The reconciler's state before its first pass: watermark 0, no re-drives."""
    return {"watermark": 0.0, "redrives": {}}


class ScalingLog:
    """The ``scaling`` table of one storage account; keeps only the table client."""

    def __init__(self, storage: Storage) -> None:
        self.table = storage.table(names.SCALE_TABLE)

    # -- the autoscaler's policy state ----------------------------------------------------------
    def policy(self, pool: str) -> PolicyRow | None:
        """The pool's stored policy state; None when there is no row yet."""
        try:
            row = self.table.get_entity(pool, STATE_ROW)
        except ResourceNotFoundError:
            return None
        except AzureError as exc:
            raise storage_error(exc, f"read the scaling state of {pool}") from None
        return PolicyRow(pool, _parsed(row.get("state")), row.metadata["etag"])

    def claim_policy(self, pool: str, state: dict, etag: str | None) -> bool:
        """Save ``state`` only if no other run saved one since ``etag`` was read (None: no row was there).
        False: another run won, and its decision stands."""
        entity = {"PartitionKey": pool, "RowKey": STATE_ROW, "state": json.dumps(state)}
        try:
            if etag is None:
                self.table.create_entity(entity)
            else:
                self.table.update_entity(entity, mode=UpdateMode.REPLACE, etag=etag,
                                         match_condition=MatchConditions.IfNotModified)
            return True
        except AzureError as exc:
            error = storage_error(exc, f"save the scaling state of {pool}")
            if isinstance(error, Conflict):  # 409 on create, 412 on update: another run won
                return False
            raise error from None

    # -- the autoscaler's decisions -------------------------------------------------------------
    def record(self, decision: DecisionRow) -> None:
        try:
            self.table.upsert_entity(decision.to_entity(), mode=UpdateMode.REPLACE)
        except AzureError as exc:
            raise storage_error(exc, f"record a scaling decision of {decision.pool}") from None

    def decisions(self, pool: str, since: str = "", until: str | None = None) -> list[DecisionRow]:
        """The pool's decisions recorded at or after ``since`` (and at or before ``until``), oldest first."""
        query, params = "PartitionKey eq @p and RowKey ge @a", {"p": pool, "a": since}
        if until is not None:
            query, params = query + " and RowKey le @b", {**params, "b": until}
        try:
            rows = [DecisionRow.from_entity(r) for r in self.table.query_entities(query, parameters=params)
                    if r["RowKey"] != STATE_ROW]
        except AzureError as exc:
            raise storage_error(exc, f"read the scaling decisions of {pool}") from None
        return sorted(rows, key=lambda d: d.at)

    # -- the reconciler ---------------------------------------------------------------------------
    def reconcile_state(self) -> dict:
        """The reconciler's state; a fresh one (watermark 0, no re-drives) when there is no row yet."""
        try:
            return json.loads(self.table.get_entity(RECONCILE, STATE_ROW)["state"])
        except ResourceNotFoundError:
            return fresh_reconcile_state()
        except AzureError as exc:
            raise storage_error(exc, "read the reconciler's state") from None

    def save_reconcile_state(self, state: dict) -> None:
        try:
            self.table.upsert_entity({"PartitionKey": RECONCILE, "RowKey": STATE_ROW, "state": json.dumps(state)})
        except AzureError as exc:
            raise storage_error(exc, "save the reconciler's state") from None

    def record_action(self, action: Action) -> None:
        try:
            self.table.upsert_entity(action.to_entity())
        except AzureError as exc:
            raise storage_error(exc, f"record a reconcile action on {action.target}") from None

    def actions(self, limit: int = 20) -> list[Action]:
        """The reconciler's latest actions, newest first; none when the table is not there yet."""
        try:
            rows = list(self.table.query_entities("PartitionKey eq @p and RowKey ne @s",
                                                  parameters={"p": RECONCILE, "s": STATE_ROW}))
        except ResourceNotFoundError:
            return []
        except AzureError as exc:
            raise storage_error(exc, "read the reconciler's actions") from None
        rows.sort(key=lambda r: r["RowKey"], reverse=True)
        return [Action.from_entity(r) for r in rows[:limit]]
