"""What a manifest asks for after its job: ``reduce:``, ``after:`` and ``notify:``, validated, and how the
ask is kept on the job row (plain JSON text fields, read back by ``of_job``).

A manifest never carries a secret: a webhook names its secret, which ``upwell.after.secrets`` looks up
(Key Vault on Azure, a local file here).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from upwell.rows import JobRow

Event = Literal["completed", "failed", "budget_exceeded", "quarantined"]
JOB_REF = r"^[A-Za-z0-9][A-Za-z0-9 ._:-]{0,199}$"  # a job id or a job's name


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ReduceSpec(_Strict):
    """A reduce step: a registered payload definition run once over every result of the job."""

    payload: str = Field(..., pattern=r"^[a-z][a-z0-9-]{0,62}(@[0-9A-Za-z][0-9A-Za-z.+-]{0,63})?$")
    params: dict[str, Any] = Field(default_factory=dict)
    artifacts: list[str] = Field(default_factory=list, max_length=32,
                                 description="globs of each shard's artifacts to stage beside its result JSON")
    pool: str | None = None

    @field_validator("artifacts")
    @classmethod
    def _relative(cls, v: list[str]) -> list[str]:
        for glob in v:
            if not glob or "/" in glob or "\\" in glob or glob.strip(".") == "":
                raise ValueError(f"artifact glob {glob!r} must be one file-name pattern (no folders)")
        return v


class Webhook(_Strict):
    url: str = Field(..., pattern=r"^https?://[^\s]+$", max_length=2000)
    secret: str = Field(..., pattern=r"^[A-Za-z0-9-]{1,127}$", description="the secret's name, never its value")


class NotifySpec(_Strict):
    """Which events to send, and where: a signed webhook, and (where configured) the Event Grid topic."""

    events: list[Event] = Field(default_factory=lambda: ["completed", "failed"], min_length=1)
    webhook: Webhook | None = None
    eventgrid: bool = True


class AfterAsk(_Strict):
    """The three asks as the job row keeps them."""

    after: str = ""
    reduce: ReduceSpec | None = None
    notify: NotifySpec | None = None


def row_fields(after: str | None, reduce: ReduceSpec | None, notify: NotifySpec | None) -> dict[str, str]:
    """The job row's fields for a manifest's asks (only those it made)."""
    out = {}
    if after:
        out["after_parent"] = after
    if reduce is not None:
        out["after_reduce"] = reduce.model_dump_json()
    if notify is not None:
        out["after_notify"] = notify.model_dump_json()
    return out


def of_job(job: JobRow) -> AfterAsk:
    """The asks recorded on a job row; a field that no longer parses counts as not asked."""
    extra = job.extra or {}
    return AfterAsk(after=str(extra.get("after_parent") or ""),
                    reduce=_load(ReduceSpec, extra.get("after_reduce")),
                    notify=_load(NotifySpec, extra.get("after_notify")))


def _load(model, text: Any):
    if not text:
        return None
    try:
        return model.model_validate(json.loads(str(text)))
    except (ValueError, ValidationError):
        return None
