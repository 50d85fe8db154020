"""A pure-Python model of the task lifecycle (design section 4) for the stateful test.

It knows no clock: time passes only when the test moves a row's timestamps into the
past, so every task is either due or not, every lease live or lapsed, and every TTL
running or passed. Each method applies one request and returns what the gateway must
answer; the state machine compares.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

FINISHED = ("completed", "dead", "expired", "cancelled")
# The janitor's repair only bumps runtimes with a task due for at least a second
# (CLAIMABLE_RUNTIMES); past this much, a task due "now" is surely that old.
REPAIR_AGE_SECONDS = 1.5
LONG_AGO = float("-inf")


@dataclass
class Task:
    id: str
    runtime: str
    seq: int  # creation order: created_at, the FIFO tie-break
    priority: int
    max_attempts: int
    fingerprint: tuple[Any, ...]  # what a replay of its idempotency key must match
    has_ttl: bool
    status: str = "queued"  # the row's status; `shown` adds the effective expiry
    attempts: int = 0
    due: bool = True
    due_since: float = field(default_factory=time.monotonic)  # when it came due
    ttl_passed: bool = False
    lease: str | None = None  # the row's lease_id, kept after some final reports
    lapsed: bool = False
    cancel_requested: bool = False
    worker: str | None = None
    result: Any = None  # shown while completed
    last_error: str | None = None

    @property
    def shown(self) -> str:
        """The status the API shows: a queued task past its TTL is expired already."""
        return "expired" if self.status == "queued" and self.ttl_passed else self.status

    @property
    def claimable(self) -> bool:
        return self.status == "queued" and self.due and not self.ttl_passed

    def requeue(self, due: bool = True) -> None:
        self.status, self.lease, self.lapsed = "queued", None, False
        self.due = due
        self.due_since = time.monotonic()

    def surely_due_for_repair(self) -> bool:
        return self.claimable and time.monotonic() - self.due_since > REPAIR_AGE_SECONDS


def fingerprint(body: dict[str, Any]) -> tuple[Any, ...]:
    """What the gateway hashes for an idempotency key: the request as understood."""
    return (
        body["payload"],
        body.get("priority", 50),
        body.get("max_attempts", 5),
        body.get("delay_seconds") or 0,
        body.get("ttl_seconds"),
    )


class Model:
    """Every task of the run's runtimes, and for each runtime whether its verdict may
    be stale (an `empty` verdict that a lost bump left matching the version)."""

    def __init__(self, runtimes: list[str]) -> None:
        self.runtimes = runtimes
        self.tasks: dict[str, Task] = {}
        self.keys: dict[tuple[str, str], str] = {}  # (runtime, idempotency key) -> task id
        self.stale: dict[str, bool] = dict.fromkeys(runtimes, False)
        self.leases: list[tuple[str, str]] = []  # every (task id, lease id) handed out

    # -- queries -------------------------------------------------------------

    def of(self, runtime: str) -> list[Task]:
        return [t for t in self.tasks.values() if t.runtime == runtime]

    def claimable(self, runtime: str) -> list[Task]:
        """Due, unexpired queued tasks in claim order: priority, then FIFO."""
        found = [t for t in self.of(runtime) if t.claimable]
        return sorted(found, key=lambda t: (-t.priority, t.seq))

    def expected_claim(self, runtime: str, max_tasks: int) -> list[str]:
        return [t.id for t in self.claimable(runtime)[:max_tasks]]

    def where(self, predicate: Any) -> list[Task]:
        return [t for t in self.tasks.values() if predicate(t)]

    # -- producers -----------------------------------------------------------

    def known_key(self, runtime: str, key: str | None) -> Task | None:
        if key is None:
            return None
        task_id = self.keys.get((runtime, key))
        return self.tasks[task_id] if task_id else None

    def add(self, runtime: str, task_id: str, body: dict[str, Any], key: str | None) -> Task:
        task = Task(
            id=task_id,
            runtime=runtime,
            seq=len(self.tasks),
            priority=body.get("priority", 50),
            max_attempts=body.get("max_attempts", 5),
            fingerprint=fingerprint(body),
            has_ttl=body.get("ttl_seconds") is not None,
            due=not body.get("delay_seconds"),
        )
        self.tasks[task_id] = task
        if key is not None:
            self.keys[(runtime, key)] = task_id
        self.stale[runtime] = False  # an enqueue bumps (I1)
        return task

    # -- daemons -------------------------------------------------------------

    def claimed(self, task_id: str, lease: str, worker: str) -> None:
        task = self.tasks[task_id]
        task.status, task.lease, task.lapsed, task.worker = "claimed", lease, False, worker
        task.attempts += 1
        task.cancel_requested = False
        self.leases.append((task_id, lease))

    def _holds(self, task: Task, lease: str) -> bool:
        return task.status == "claimed" and task.lease == lease

    # Each lease report returns whether it must succeed (200), else 409 lease_lost.

    def heartbeat(self, task_id: str, lease: str) -> bool:
        task = self.tasks[task_id]
        if not self._holds(task, lease):
            return False
        task.lapsed = False  # a lapsed lease nobody replaced is still honoured
        return True

    def complete(self, task_id: str, lease: str, result: Any) -> bool:
        task = self.tasks[task_id]
        if self._holds(task, lease):
            task.status = "cancelled" if task.cancel_requested else "completed"
            task.result = result
            return True
        if task.status in ("completed", "cancelled") and task.lease == lease:
            return True  # a repeat with the same lease
        return False

    def fail(
        self, task_id: str, lease: str, error: str, retry: bool, retry_after: float | None
    ) -> bool:
        task = self.tasks[task_id]
        if not self._holds(task, lease):
            return False
        task.last_error = error
        if task.cancel_requested:
            task.status = "cancelled"
        elif retry and task.attempts < task.max_attempts:
            task.requeue(due=retry_after == 0)
            self.stale[task.runtime] = False
        else:
            task.status = "dead"
        return True

    def release(self, task_id: str, lease: str) -> bool:
        task = self.tasks[task_id]
        if not self._holds(task, lease):
            return False
        if task.cancel_requested:
            task.status = "cancelled"
        else:
            task.requeue()
            self.stale[task.runtime] = False
        return True

    # -- operators -----------------------------------------------------------

    def cancel(self, task_id: str) -> int:
        """The HTTP status a cancel must answer."""
        task = self.tasks[task_id]
        if task.shown == "queued":
            task.status = "cancelled"
        elif task.shown == "claimed":
            task.cancel_requested = True
        elif task.shown != "cancelled":
            return 409
        return 200

    def retry(self, task_id: str) -> int:
        task = self.tasks[task_id]
        if task.shown not in ("dead", "expired", "cancelled"):
            return 409
        task.requeue()
        task.attempts, task.cancel_requested, task.result = 0, False, None
        if task.ttl_passed:  # an expiry already past is dropped
            task.has_ttl = task.ttl_passed = False
        self.stale[task.runtime] = False
        return 200

    # -- time and the janitor ------------------------------------------------

    def janitor_reclaim(self) -> tuple[int, set[str]]:
        """Lapsed leases taken back: (how many, runtimes that got a task queued)."""
        count, bumped = 0, set()
        for task in self.where(lambda t: t.status == "claimed" and t.lapsed):
            count += 1
            task.last_error = task.last_error or "lease expired"
            if task.cancel_requested or task.attempts >= task.max_attempts:
                # Ended for good; the reclaim clears the lease whatever the outcome.
                task.lease, task.lapsed = None, False
            if task.cancel_requested:
                task.status = "cancelled"
            elif task.attempts >= task.max_attempts:
                task.status = "dead"
            else:
                task.requeue()
                bumped.add(task.runtime)
        for task in self.where(lambda t: t.status == "queued" and t.ttl_passed):
            task.status = "expired"
        for runtime in bumped:
            self.stale[runtime] = False
        return count, bumped
