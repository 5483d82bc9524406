"""Maximum wall-clock, per job and per shard attempt: the kill switches.

A manifest (``max_wall_clock_s``, ``max_shard_wall_clock_s``) and a pool (the same PoolSpec
fields) may each set them; the tighter one is written on the job row at ingest. The agent
stops an attempt that runs past the shard limit and drops the shards of a job past its limit;
the janitor marks such jobs killed and ends their Batch jobs.
"""

from __future__ import annotations

from datetime import UTC, datetime

from upwell.rows import JobRow
from upwell.timeutil import parse_iso


def tighter(*limits: float | None) -> float | None:
    set_ = [float(x) for x in limits if x]
    return min(set_) if set_ else None


def shard_timeout(job: JobRow) -> float | None:
    return job.max_shard_wall_clock_s or None


def job_overdue(job: JobRow, now: datetime | None = None) -> str:
    """Why the job may run no more ('' while it may): killed, or past its max wall-clock."""
    if job.killed_at:
        return job.killed_reason or "killed"
    limit = job.max_wall_clock_s
    start = parse_iso(job.started_at or job.accepted_at or job.created_at)
    if not limit or start is None:
        return ""
    ran = ((now or datetime.now(UTC)) - start).total_seconds()
    return f"killed: the job ran {ran:.0f} s, past its max wall-clock of {limit:g} s" if ran > limit else ""


def shard_killed(job: JobRow) -> str:
    return f"killed: the attempt ran past its max wall-clock of {shard_timeout(job):g} s"
