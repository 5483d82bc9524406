"""The HTTP API's jobs as one caller may see them: the list, a job's status and detail, cancel, rerun, a
report file and a shard's log, each only within the caller's projects (``upwell.access.principal``).

Every call on one job reads its row first: no such job is None (404), a job of another project raises
ProjectForbidden (403) before anything of it is read or changed. The dashboard's page and the API share
these calls, so a button and an automation script are held to the same rule.
"""

from __future__ import annotations

from dataclasses import asdict
from itertools import islice
from typing import Any

from upwell import names
from upwell.access.principal import Caller
from upwell.errors import NotFound
from upwell.ledger import JobRow, JobState, Ledger
from upwell.results.status import JOB_FIELDS, job_status
from upwell.settings import Settings
from upwell.storage import Storage

LIST_LIMIT = 200
LOG_LIMIT = 1024 * 1024  # the last MiB of a payload.log: a page, not a download of a runaway log


class JobAPI:
    """The calls of one request: its storage, settings and caller; keeps nothing between requests."""

    def __init__(self, storage: Storage, settings: Settings, caller: Caller) -> None:
        self.storage, self.settings, self.caller = storage, settings, caller
        self.ledger = Ledger(storage)

    def project(self, job: JobRow) -> str:
        return job.project or self.settings.project

    def visible(self, job: JobRow) -> bool:
        return self.caller.allows(self.project(job))

    def job(self, job_id: str, what: str) -> JobRow | None:
        """The job row, once the caller may ``what`` it; None when there is no such job."""
        job = self.ledger.job(job_id) if job_id and "/" not in job_id else None
        if job is not None:
            self.caller.require(self.project(job), what)
        return job

    def jobs(self, *, owner: str = "", project: str = "", state: str = "") -> list[dict[str, Any]]:
        """The caller's jobs, newest first, filtered by owner, project and state where given: one query of
        the job catalogue (upwell.jobcatalog), then a point read of each job listed (at most LIST_LIMIT)."""
        where: dict[str, Any] = {"owner": owner} if owner else {}
        if not self.caller.everything:
            where["project"] = [p for p in sorted(self.caller.projects or ()) if not project or p == project]
        elif project:
            where["project"] = project
        states = [JobState(state)] if state in {s.value for s in JobState} else []
        if state and not states:
            return []
        rows = (j for j in self.ledger.jobs(*states, newest_first=True, at_once=16, **where) if self.visible(j))
        return [{"job_id": j.job_id, **{k: getattr(j, k) for k in JOB_FIELDS}, "status": j.status.value}
                for j in islice(rows, LIST_LIMIT)]

    def status(self, job_id: str) -> dict | None:
        return job_status(self.storage, job_id, self.ledger) if self.job(job_id, "see jobs") else None

    def cancel(self, job_id: str) -> dict | None:
        """Cancel the job without waiting for its running shards (their agents stop them on the next tick)."""
        from upwell.lifecycle.cancel import cancel_job

        if self.job(job_id, "cancel jobs") is None:
            return None
        return asdict(cancel_job(self.storage, job_id, wait_s=0, ledger=self.ledger))

    def rerun(self, job_id: str, *, failed: bool = False) -> dict | None:
        """Re-run every shard that did not succeed (only the failed ones with ``failed``)."""
        from upwell.lifecycle.rerun import rerun_job

        if self.job(job_id, "rerun jobs") is None:
            return None
        return {"job_id": job_id, "shards": rerun_job(self.storage, job_id, failed=failed, ledger=self.ledger)}

    def shard_log(self, job_id: str, shard_id: str) -> bytes | None:
        """The last attempt's payload.log (results/<job>/<shard>/payload.log), its last LOG_LIMIT bytes. An
        attempt whose payload printed nothing keeps no log (workers.staging.keep_log): once the shard row shows
        an attempt that ended, a missing log is an empty one (b""); None until then, or for no such shard."""
        if not shard_id or shard_id in (".", "..") or "/" in shard_id or self.job(job_id, "see jobs") is None:
            return None
        try:
            data = self.storage.read(f"{names.RESULTS}/{job_id}/{shard_id}/payload.log")
        except NotFound:
            row = self.ledger.shard(job_id, shard_id)  # read only when there is no log: it ran silently, or not yet
            return b"" if row is not None and row.attempt_ended else None
        return data[-LOG_LIMIT:]
