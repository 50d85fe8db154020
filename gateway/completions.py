"""Single completes (`POST /v1/tasks/{id}/complete`) that arrive together share one
Postgres statement and one commit.

A daemon that finished a claimed batch reports each task in a request of its own, and
many daemons report at once: one statement and one commit per task made the commit
(its WAL flush) and the round trip the cost of every complete. Here a complete joins
the ones waiting for a statement; up to GROUPS_IN_FLIGHT statements run at a time,
each for up to GROUP_MAX waiting completes (store.complete_group). Alone, a complete
is sent at once, in a statement of its own: grouping adds no wait, it only forms
while statements are already running. Each request is answered after the commit
that completed its task, as before, with the task as that statement left it.

A complete the statement did not apply (the lease no longer holds the task, a repeat,
no such task) is then answered by its own request, exactly as a lone complete is
(store.complete_missed): 200 with the finished task for a repeat by the same lease,
else 409 lease_lost or 404. A task named twice in one group would be updated once
with either request's result, so a second complete of a task waits for the next
statement, where it is a repeat. A failed statement fails every request of its group
(503, as a lone complete's failure is).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from .metrics import Metrics
from .rows import TaskRow

# Statements in flight at a time: one slow statement (a row lock held elsewhere)
# does not hold up every complete of the process, and the pool keeps room for claims.
GROUPS_IN_FLIGHT = 4
# Completes per statement at most: a group's rows are locked until its commit.
GROUP_MAX = 200


class GroupStore(Protocol):
    """What grouped completes need from storage (Store)."""

    async def complete_group(
        self,
        task_ids: list[uuid.UUID],
        lease_ids: list[uuid.UUID],
        results: list[str | None],
    ) -> dict[uuid.UUID, TaskRow]: ...

    async def complete_missed(self, task_id: uuid.UUID, lease_id: uuid.UUID) -> TaskRow: ...


@dataclass(eq=False, slots=True)
class _Complete:
    """One request's complete, waiting for its statement. `done` holds the task the
    statement completed, or None when it did not apply to this one."""

    task_id: uuid.UUID
    lease_id: uuid.UUID
    result: str | None
    done: asyncio.Future[TaskRow | None]


class Completions:
    """Groups the single completes of this process (module doc). Owned by the Gateway,
    which calls `close()` before the pool closes."""

    def __init__(self, store: GroupStore, metrics: Metrics) -> None:
        self._store = store
        self._metrics = metrics
        self._waiting: deque[_Complete] = deque()
        self._senders: set[asyncio.Task[None]] = set()

    async def complete(
        self, task_id: uuid.UUID, lease_id: uuid.UUID, result: str | None
    ) -> TaskRow:
        """Complete the task held by `lease_id`: the finished task, or LeaseLost,
        NotFound or StoreUnavailable, as one statement of its own would answer."""
        item = _Complete(task_id, lease_id, result, asyncio.get_running_loop().create_future())
        self._waiting.append(item)
        if len(self._senders) < GROUPS_IN_FLIGHT:
            sender = asyncio.create_task(self._send(), name="complete-group")
            self._senders.add(sender)
            sender.add_done_callback(self._senders.discard)
        row = await item.done
        if row is None:
            return await self._store.complete_missed(task_id, lease_id)
        return row

    def _take(self) -> list[_Complete]:
        """The next group, in arrival order: at most GROUP_MAX completes of distinct
        tasks. A second complete of a task stays waiting for a later statement, and a
        complete whose request was cancelled meanwhile is dropped."""
        group: list[_Complete] = []
        later: list[_Complete] = []
        named: set[uuid.UUID] = set()
        while self._waiting and len(group) < GROUP_MAX:
            item = self._waiting.popleft()
            if item.done.done():
                continue
            if item.task_id in named:
                later.append(item)
                continue
            named.add(item.task_id)
            group.append(item)
        self._waiting.extendleft(reversed(later))
        return group

    async def _send(self) -> None:
        """Send groups until nothing waits; each request learns its own outcome."""
        while self._waiting:
            group = self._take()
            if not group:
                continue
            self._metrics.complete_statements.inc()
            try:
                rows = await self._store.complete_group(
                    [i.task_id for i in group],
                    [i.lease_id for i in group],
                    [i.result for i in group],
                )
            except asyncio.CancelledError:
                for item in group:
                    item.done.cancel()
                raise
            except Exception as exc:
                # StoreUnavailable (or a bug): every request of the group fails as its
                # own statement's failure would have failed it.
                for item in group:
                    if not item.done.done():
                        item.done.set_exception(exc)
                continue
            for item in group:
                if not item.done.done():
                    item.done.set_result(rows.get(item.task_id))

    async def close(self) -> None:
        """Let the statements in flight finish (each bounded by the statement timeout)."""
        if self._senders:
            with contextlib.suppress(Exception):
                await asyncio.gather(*self._senders, return_exceptions=True)
