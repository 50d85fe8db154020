"""The gateway as the worker loop sees it: `Transport`, the calls the loop makes
(`AsyncClient` has them; tests pass a fake), `Handler`, the user's code it runs per
task, and `BatchCalls`, whether the gateway has the batch calls (`heartbeat_many`,
`complete_many`), which the heartbeats and the reports share.

`describe` names a failed call in the loop's log lines, all written on the
`gateway_client.worker` logger.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

from .errors import MethodNotAllowed, NotFound
from .models import Beat, Claimed, Completion, Failure, ItemOutcome, Task

# The worker loop's one logger, whichever of its modules writes: the README names it.
log = logging.getLogger("gateway_client.worker")

Handler = Callable[[Task], Awaitable[Any]]


class Transport(Protocol):
    """The calls the loop makes; AsyncClient has them, tests pass a fake."""

    async def claim(
        self,
        runtime: str,
        worker_id: str,
        *,
        max_tasks: int = 1,
        wait_seconds: float = 0,
        lease_seconds: int | None = None,
        complete: Iterable[Completion] | None = None,
        fail: Iterable[Failure] | None = None,
    ) -> Claimed: ...

    async def heartbeat(
        self, task_id: str, lease_id: str, lease_seconds: int | None = None
    ) -> Task: ...

    async def complete(self, task_id: str, lease_id: str, result: Any = None) -> Task: ...

    async def fail(
        self,
        task_id: str,
        lease_id: str,
        error: str,
        *,
        retry: bool = True,
        retry_after_seconds: float | None = None,
    ) -> Task: ...

    async def release(self, task_id: str, lease_id: str) -> Task: ...

    async def complete_many(self, items: list[Completion]) -> list[ItemOutcome]: ...

    async def heartbeat_many(self, items: list[Beat]) -> list[ItemOutcome]: ...


class BatchCalls:
    """Whether the loop uses the batch calls: yes until a gateway without them says so.
    One per worker loop, shared by its heartbeats and its completions, so that whichever
    finds out first spares the other a failed request."""

    def __init__(self, runtime: str) -> None:
        self.runtime = runtime  # for the log line
        self.available = True

    def lacking(self, exc: BaseException) -> bool:
        """True the first time a batch call shows the gateway lacks it (an older one
        answers the whole request 404 or 405): the loop then makes single calls."""
        if not (self.available and isinstance(exc, NotFound | MethodNotAllowed)):
            return False
        log.warning(
            "runtime=%s the gateway has no batch calls (%s); using one call per task",
            self.runtime,
            describe(exc),
        )
        self.available = False
        return True


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
