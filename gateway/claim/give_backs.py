"""Leases that never reached their poll, given back to the queue in shared statements.

A claim whose client left while its tasks were being leased gives them back (not as
an attempt), so that other polls get them at once rather than after the lease runs
out. When a flood of clients ends, hundreds of claims find their client gone in the
same instant: one statement each, at a release's place in the database's line
(gateway/admission.py), kept every claim of the clients still there waiting for a
second or more. Here a give-back joins those waiting for a statement: one runs at a
time, for up to GROUP_MAX tasks of any runtimes, and then one Redis round trip bumps
every runtime it returned tasks to (I1). Alone, a give-back is sent at once: grouping
adds no wait, it only forms while a statement is already running.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from .. import admission, logs
from ..admission import releasing
from ..errors import StoreUnavailable
from ..rows import TaskRow

log = logging.getLogger("gateway.claim")

# Tasks one statement gives back at most (a request's own are never split).
GROUP_MAX = 1000

Unclaim = Callable[[Sequence[uuid.UUID], Sequence[uuid.UUID]], Awaitable[object]]
AnnounceMany = Callable[[Sequence[str]], Awaitable[None]]


@dataclass(eq=False, slots=True)
class _GiveBack:
    runtime_id: str
    task_ids: list[uuid.UUID]
    lease_ids: list[uuid.UUID]
    done: asyncio.Future[None]


class GiveBacks:
    """The give-backs of this process (module doc). Owned by the Claimer."""

    def __init__(self, unclaim: Unclaim, announce_many: AnnounceMany) -> None:
        """`unclaim(task_ids, lease_ids)`: the store's statement, which returns each task
        whose lease still holds it; `announce_many(runtime_ids)`: the bumps and
        wake-ups after its commit."""
        self._unclaim = unclaim
        self._announce_many = announce_many
        self._waiting: list[_GiveBack] = []
        self._sender: asyncio.Task[None] | None = None

    async def give_back(self, runtime_id: str, tasks: list[TaskRow]) -> None:
        """`queue`, and return once the statement that carried the tasks committed, or
        failed (then the leases lapse and the janitor takes them back). A caller
        cancelled meanwhile does not stop it."""
        done = self.queue(runtime_id, tasks)
        if done is not None:
            await done

    def queue(self, runtime_id: str, tasks: list[TaskRow]) -> asyncio.Future[None] | None:
        """Return `tasks` (leased, never delivered) to the runtime's queue, each only
        while its lease still holds it, and wake the runtime's polls, in the background:
        a future done once their statement ended (None: no lease to give back)."""
        held = [t for t in tasks if t.lease_id is not None]
        if not held:
            return None
        item = _GiveBack(
            runtime_id,
            [t.id for t in held],
            [t.lease_id for t in held if t.lease_id is not None],
            asyncio.get_running_loop().create_future(),
        )
        self._waiting.append(item)
        if self._sender is None:
            self._sender = asyncio.create_task(self._send_all(), name="give-back")
        return item.done

    async def close(self) -> None:
        """Wait for the give-backs queued so far to be sent (before the pool closes)."""
        while self._sender is not None:
            await asyncio.shield(self._sender)

    async def _send_all(self) -> None:
        """Send groups until none waits."""
        logs.detach()  # started by one request, it sends for many
        admission.detach()
        try:
            while self._waiting:
                group = self._take()
                try:
                    await self._send(group)
                except Exception:
                    log.exception("giving back undelivered leases failed")
                finally:
                    for item in group:
                        if not item.done.done():
                            item.done.set_result(None)
        finally:
            self._sender = None

    def _take(self) -> list[_GiveBack]:
        """The next group, in arrival order: up to GROUP_MAX tasks (at least one
        request's, whatever its size)."""
        size = 0
        for count, item in enumerate(self._waiting):
            size += len(item.task_ids)
            if count and size > GROUP_MAX:
                break
        else:
            count = len(self._waiting)
        group, self._waiting = self._waiting[:count], self._waiting[count:]
        return group

    async def _send(self, group: list[_GiveBack]) -> None:
        task_ids = [i for item in group for i in item.task_ids]
        lease_ids = [i for item in group for i in item.lease_ids]
        try:
            with releasing():  # it frees work: never shed (gateway/admission.py)
                await self._unclaim(task_ids, lease_ids)
        except StoreUnavailable:
            log.warning("could not give back %d undelivered leases", len(task_ids))
            return
        await self._announce_many(list(dict.fromkeys(item.runtime_id for item in group)))
