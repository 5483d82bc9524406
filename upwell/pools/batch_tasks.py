"""A gang pool's agent tasks on Batch: the pool's one job, made idempotently, and the agent tasks the
backlog wants, added where missing (the builders and the lease decision: upwell.pools.build_batch_tasks).

``reconcile(want)`` lists the job's live tasks (active, preparing, running; filtered on state), ends the
surplus that still waits for nodes, and adds one task for each wanted allocation beyond those live (a
k-node agent is a multi-instance task of k), making the job first if the list found none (a 409
JobExists is success: another scaler made it meanwhile). It never ends a running task: an agent task
ends itself when idle, and a running one may hold a work item.

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


def _s(value: Any) -> str:
    """An SDK enum or string as the lower-case native name ("active")."""
    return str(getattr(value, "value", value) or "").lower()


class AgentTasks:
    def __init__(self, client: Any, spec: PoolSpec, *, now: Callable[[], datetime] | None = None):
        self.client, self.spec = client, spec
        self.job_id = tasks.job_id(spec)
        self._job_ready = False
        self._now = now or (lambda: datetime.now(UTC))

    def reconcile(self, want: dict[int, int]) -> list[str]:
        """Make the live agent tasks match ``want`` ({k: count}): add the missing ones, and end the surplus
        that still waits for nodes (state active: it never started, so it holds no work item; one that
        started meanwhile is stopped, and an item it took comes back: released on SIGTERM, else by
        visibility).
        A running surplus task is left to end itself when idle. Returns the ids added. Raises the SDK's
        AzureError (the pool translates it)."""
        live = self._live()
        self._end_surplus(live, want)
        missing = {k: count - len(live.get(k, {})) for k, count in want.items() if count > len(live.get(k, {}))}
        if not missing:
            return []
        self.ensure_job()
        added = []
        for k, count in sorted(missing.items()):
            free = (s for s in range(count + len(live.get(k, {}))) if s not in live.get(k, {}))
            added += [self._add(k, slot) for slot in list(free)[:count]]
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

    def _live(self) -> dict[int, dict[int, tuple[str, str]]]:
        """{k: {slot: (task id, state)}} of the job's live agent tasks; {} while the job does not exist."""
        from azure.core.exceptions import ResourceNotFoundError

        live: dict[int, dict[int, tuple[str, str]]] = {}
        try:
            for task in self.client.list_tasks(self.job_id, filter=tasks.LIVE_STATES_FILTER,
                                               select=["id", "state"]):
                parsed = tasks.parse_task_id(task.id)
                if parsed:
                    live.setdefault(parsed[0], {})[parsed[1]] = (task.id, _s(task.state))
        except ResourceNotFoundError:
            self._job_ready = False  # JobNotFound: made before the first task is added
            return {}
        self._job_ready = True
        return live

    def _end_surplus(self, live: dict[int, dict[int, tuple[str, str]]], want: dict[int, int]) -> None:
        for k, slots in live.items():
            surplus = len(slots) - want.get(k, 0)
            waiting = sorted((s for s, (_, state) in slots.items() if state == "active"), reverse=True)
            for slot in waiting[:max(surplus, 0)]:
                self.client.terminate_task(self.job_id, slots[slot][0])
                del slots[slot]
                log.info("batch.agent_task_ended", pool=self.spec.name, task=f"n{k}-s{slot}", reason="not wanted")

    def _add(self, k: int, slot: int) -> str:
        from azure.batch import models as m
        from azure.core.exceptions import ResourceExistsError

        tid = tasks.task_id(k, slot, self._now())
        try:
            body = tasks.agent_task(self.spec, k, tid, warm=tasks.is_warm(self.spec, k, slot))
            self.client.create_task(self.job_id, m.BatchTaskCreateOptions(body))
        except ResourceExistsError as exc:
            if not has_code(exc, "TaskExists"):
                raise
        log.info("batch.agent_task_added", pool=self.spec.name, task=tid, nodes=k)
        return tid
