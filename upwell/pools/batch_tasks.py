"""A gang pool's agent tasks on Batch: the pool's one job, made idempotently, and the agent tasks the
backlog wants, added where missing (the builders and the lease decision: upwell.pools.build_batch_tasks).

``reconcile(want)`` makes the job once per instance (a 409 JobExists is success: another scaler, or an
earlier run, made it), lists the job's live tasks (active, preparing, running; filtered on state), and adds
one task for each wanted allocation beyond those live: a k-node agent is a multi-instance task of k. It
never ends or deletes a task: an agent task ends itself when idle, and a running one holds a work item.

State kept: the client, the spec, whether the job is known to exist, the clock (tests pin it).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from upwell import logs
from upwell.pools import build_batch_tasks as tasks
from upwell.pools.azure_errors import has_code
from upwell.pools.base import PoolSpec

log = logs.get("upwell.pools.batch")


class AgentTasks:
    def __init__(self, client: Any, spec: PoolSpec, *, now: Callable[[], datetime] | None = None):
        self.client, self.spec = client, spec
        self.job_id = tasks.job_id(spec)
        self._job_ready = False
        self._now = now or (lambda: datetime.now(UTC))

    def reconcile(self, want: dict[int, int]) -> list[str]:
        """Add the agent tasks ``want`` ({k: count}) lacks beyond the live ones; returns the ids added.
        Raises the SDK's AzureError (the pool translates it)."""
        if not want:
            return []
        self.ensure_job()
        live = self._live()
        added = []
        for k, count in sorted(want.items()):
            taken = live.get(k, set())
            free = (s for s in range(count + len(taken)) if s not in taken)
            for slot in list(free)[:max(count - len(taken), 0)]:
                added.append(self._add(k, slot))
        return added

    def ensure_job(self) -> None:
        """Create the pool's job unless this instance knows it exists; JobExists is success."""
        if self._job_ready:
            return
        from azure.batch import models as m
        from azure.core.exceptions import ResourceExistsError

        try:
            self.client.create_job(m.BatchJobCreateOptions(tasks.job_body(self.spec)))
            log.info("batch.job_created", pool=self.spec.name, job=self.job_id)
        except ResourceExistsError as exc:
            if not has_code(exc, "JobExists"):
                raise  # JobBeingDeleted, JobBeingTerminated: not a job to add tasks to
        self._job_ready = True

    def _live(self) -> dict[int, set[int]]:
        """{k: slots} of the job's live agent tasks."""
        live: dict[int, set[int]] = {}
        for task in self.client.list_tasks(self.job_id, filter=tasks.LIVE_STATES_FILTER, select=["id", "state"]):
            parsed = tasks.parse_task_id(task.id)
            if parsed:
                live.setdefault(parsed[0], set()).add(parsed[1])
        log.debug("batch.agent_tasks", pool=self.spec.name, live={k: len(v) for k, v in live.items()})
        return live

    def _add(self, k: int, slot: int) -> str:
        from azure.batch import models as m
        from azure.core.exceptions import ResourceExistsError

        tid = tasks.task_id(k, slot, self._now())
        try:
            self.client.create_task(self.job_id, m.BatchTaskCreateOptions(tasks.agent_task(self.spec, k, tid)))
        except ResourceExistsError as exc:
            if not has_code(exc, "TaskExists"):
                raise
        log.info("batch.agent_task_added", pool=self.spec.name, task=tid, nodes=k)
        return tid
