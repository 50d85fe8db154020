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

Batch acknowledgements (`POST /v1/tasks:complete`) group the same way, in statements
of their own (store.complete_many): those waiting together share one when they come
with the same runtime patterns (the statement checks them once) and name no task in
common, up to GROUP_MAX tasks (a larger one goes alone). Each gets its own items'
outcomes, exactly as from a statement of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from .. import logs
from ..metrics import Metrics
from ..rows import ItemResult, TaskRow
from .lease_spans import LeaseSpans

# Statements in flight at a time: one slow statement (a row lock held elsewhere)
# does not hold up every complete of the process, and the pool keeps room for claims.
GROUPS_IN_FLIGHT = 4
# Completes per statement at most: a group's rows are locked until its commit.
GROUP_MAX = 200
# And results per statement at most, in bytes of JSON text (one larger result goes
# alone): the statement sends them and answers with the rows, within its timeout.
GROUP_MAX_RESULT_BYTES = 16 << 20


class GroupStore(Protocol):
    """What grouped completes need from storage (Store)."""

    async def complete_group(
        self,
        task_ids: list[uuid.UUID],
        lease_ids: list[uuid.UUID],
        results: list[str | None],
    ) -> dict[uuid.UUID, TaskRow]: ...

    async def complete_missed(self, task_id: uuid.UUID, lease_id: uuid.UUID) -> TaskRow: ...

    async def complete_many(
        self,
        task_ids: Sequence[uuid.UUID],
        lease_ids: Sequence[uuid.UUID],
        results: Sequence[str | None],
        runtimes: Sequence[str] | None,
    ) -> list[ItemResult]: ...


@dataclass(eq=False, slots=True)
class _Complete:
    """One request's complete, waiting for its statement. `done` holds the task the
    statement completed, or None when it did not apply to this one."""

    task_id: uuid.UUID
    lease_id: uuid.UUID
    result: str | None
    done: asyncio.Future[TaskRow | None]


@dataclass(eq=False, slots=True)
class _Acknowledgement:
    """One batch acknowledgement (`POST /v1/tasks:complete`), waiting for its statement:
    its items, the caller's runtime patterns (None: every runtime), and `done`, its
    items' outcomes in its own order."""

    task_ids: list[uuid.UUID]
    lease_ids: list[uuid.UUID]
    results: list[str | None]
    runtimes: tuple[str, ...] | None
    done: asyncio.Future[list[ItemResult]]


class _Waiting(Protocol):
    done: asyncio.Future[Any]


W = TypeVar("W", bound=_Waiting)


@dataclass(eq=False)
class _Lane(Generic[W]):
    """One kind of grouped statement: the requests waiting for it, how a group is taken
    from them (`take`) and sent (`send`, which settles each item's `done`), and how many
    senders are sending. A sender counts itself out in the same step in which it finds
    nothing waiting (not in a done callback, which runs a loop turn later: a request
    arriving in between would wait with no sender for it)."""

    name: str
    take: Callable[[], list[W]]
    send: Callable[[list[W]], Awaitable[None]]
    waiting: deque[W] = field(default_factory=deque)
    sending: int = 0


class Completions:
    """Groups the single completes of this process (module doc). Owned by the Gateway,
    which calls `close()` before the pool closes."""

    def __init__(
        self, store: GroupStore, metrics: Metrics, lease_spans: LeaseSpans | None = None
    ) -> None:
        self._store = store
        self._lease_spans = lease_spans
        self._metrics = metrics
        self._singles: _Lane[_Complete] = _Lane("complete-group", self._take, self._send)
        self._acks: _Lane[_Acknowledgement] = _Lane(
            "acknowledgement-group", self._take_acks, self._send_acks
        )
        self._senders: set[asyncio.Task[None]] = set()  # for close()
        # The newest complete of each task not yet answered: a later complete of the
        # same task waits for it, then joins a later statement (where it is a repeat).
        self._latest: dict[uuid.UUID, asyncio.Future[TaskRow | None]] = {}

    async def complete(
        self, task_id: uuid.UUID, lease_id: uuid.UUID, result: str | None
    ) -> TaskRow:
        """Complete the task held by `lease_id`: the finished task, or LeaseLost,
        NotFound or StoreUnavailable, as one statement of its own would answer."""
        item = _Complete(task_id, lease_id, result, asyncio.get_running_loop().create_future())
        prior = self._latest.get(task_id)
        self._latest[task_id] = item.done
        try:
            if prior is not None:
                await asyncio.wait((prior,))
            self._submit(self._singles, item)
            row = await item.done
        finally:
            if not item.done.done():
                item.done.cancel()  # this request was cancelled: a later one goes on
            if self._latest.get(task_id) is item.done:
                del self._latest[task_id]
        if row is None:  # not applied now: a repeat, or a lease lost
            return await self._store.complete_missed(task_id, lease_id)
        if self._lease_spans is not None:
            self._lease_spans.ended(row, lease_id, "complete")
        return row

    def _submit(self, lane: _Lane[W], item: W) -> None:
        """Queue `item` on its lane, with a sender for it unless GROUPS_IN_FLIGHT are
        sending already (one of them takes it)."""
        lane.waiting.append(item)
        if lane.sending < GROUPS_IN_FLIGHT:
            lane.sending += 1
            task = asyncio.create_task(self._send_all(lane), name=lane.name)
            self._senders.add(task)
            task.add_done_callback(self._senders.discard)

    async def _send_all(self, lane: _Lane[W]) -> None:
        """Send the lane's groups until nothing waits. A failed statement fails every
        request of its group, as its own statement's failure would have failed it."""
        logs.detach()  # started by one request, it sends for many
        try:
            while lane.waiting:
                group = lane.take()
                if not group:
                    continue
                self._metrics.complete_statements.inc()
                try:
                    await lane.send(group)
                except asyncio.CancelledError:
                    for item in group:
                        item.done.cancel()
                    raise
                except Exception as exc:  # StoreUnavailable, or a bug
                    for item in group:
                        if not item.done.done():
                            item.done.set_exception(exc)
        finally:
            lane.sending -= 1

    def _take(self) -> list[_Complete]:
        """The next group, in arrival order: at most GROUP_MAX completes of distinct
        tasks. A second complete of a task stays waiting for a later statement, and a
        complete whose request was cancelled meanwhile is dropped."""
        group: list[_Complete] = []
        later: list[_Complete] = []
        named: set[uuid.UUID] = set()
        size = 0
        waiting = self._singles.waiting
        while waiting and len(group) < GROUP_MAX:
            item = waiting[0]
            if item.done.done():
                waiting.popleft()
                continue
            grown = size + len(item.result or "")
            if group and grown > GROUP_MAX_RESULT_BYTES:
                break
            waiting.popleft()
            if item.task_id in named:  # not expected: complete() keeps one per task
                later.append(item)
                continue
            named.add(item.task_id)
            group.append(item)
            size = grown
        waiting.extendleft(reversed(later))
        return group

    async def _send(self, group: list[_Complete]) -> None:
        """One statement for a group of completes; each request learns its own row."""
        rows = await self._store.complete_group(
            [i.task_id for i in group], [i.lease_id for i in group], [i.result for i in group]
        )
        for item in group:
            if not item.done.done():
                item.done.set_result(rows.get(item.task_id))

    # -- batch acknowledgements ---------------------------------------------------

    async def complete_many(
        self,
        task_ids: Sequence[uuid.UUID],
        lease_ids: Sequence[uuid.UUID],
        results: Sequence[str | None],
        runtimes: Sequence[str] | None,
    ) -> list[ItemResult]:
        """A batch acknowledgement's outcomes, one per item in its order, as
        Store.complete_many answers them; it shares its statement with the others
        waiting that name none of its tasks and come with the same runtime patterns."""
        item = _Acknowledgement(
            list(task_ids),
            list(lease_ids),
            list(results),
            None if runtimes is None else tuple(runtimes),
            asyncio.get_running_loop().create_future(),
        )
        self._submit(self._acks, item)
        return await item.done

    def _take_acks(self) -> list[_Acknowledgement]:
        """The next group of acknowledgements, in arrival order: those with the first
        one's runtime patterns, no task named twice, GROUP_MAX tasks at most (a larger
        acknowledgement goes alone). The others stay waiting, in their order."""
        group: list[_Acknowledgement] = []
        later: list[_Acknowledgement] = []
        named: set[uuid.UUID] = set()
        size = 0
        waiting = self._acks.waiting
        while waiting:
            item = waiting.popleft()
            if item.done.done():
                continue
            grown = size + sum(len(r or "") for r in item.results)
            if group and (
                item.runtimes != group[0].runtimes
                or len(named) + len(item.task_ids) > GROUP_MAX
                or grown > GROUP_MAX_RESULT_BYTES
                or not named.isdisjoint(item.task_ids)
            ):
                later.append(item)
                continue
            group.append(item)
            named.update(item.task_ids)
            size = grown
        waiting.extendleft(reversed(later))
        return group

    async def _send_acks(self, group: list[_Acknowledgement]) -> None:
        """One statement for a group of acknowledgements; each gets its own items'
        outcomes back (the statement answers in item order)."""
        outcomes = await self._store.complete_many(
            [t for i in group for t in i.task_ids],
            [lease for i in group for lease in i.lease_ids],
            [r for i in group for r in i.results],
            group[0].runtimes,
        )
        start = 0
        for item in group:
            end = start + len(item.task_ids)
            if not item.done.done():
                item.done.set_result(outcomes[start:end])
            start = end

    async def close(self) -> None:
        """Let the statements in flight finish (each bounded by the statement timeout)."""
        senders = list(self._senders)
        if senders:
            with contextlib.suppress(Exception):
                await asyncio.gather(*senders, return_exceptions=True)
