"""The claim statements' line (I9): at most GATEWAY_MAX_CONCURRENT_CLAIMS Postgres claims in
flight per process, the others waiting for a slot in arrival order.

Under overload that line can stand: every slot busy, and statements waiting behind
them for longer than a client should wait. A claim without a wait that arrives then is
answered at once with `429 overloaded` and Retry-After, instead of joining a line it
would leave past its budget (GATEWAY_DB_QUEUE_BUDGET_MS), as work in the database's
own line is (gateway/admission.py). Whether the line stands is read from the statement
that has waited longest, now, not from a mean of statements past: once the line
drains, the next claim is let in, so a slow statement cannot keep claims refused
after it ended, and a refusal changes nothing that a later decision reads. A long
poll is never refused for it: it has time to wait, and is answered by its deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator

from ..errors import Overloaded
from ..metrics import Metrics
from ..settings import Settings
from .waiters import RuntimeState, Waiter


class ClaimSlots:
    """The process's claim slots and the statements waiting for one. Owned by Pumps."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self._settings = settings
        self._metrics = metrics
        self._slots = asyncio.Semaphore(settings.max_concurrent_claims)
        # The loop time at which each statement waiting for a slot began to wait, in
        # arrival order (the semaphore serves them in that order).
        self._waiting_since: deque[float] = deque()

    def standing_ms(self) -> float:
        """How long the statement first in line has waited for a slot, in ms; 0 with
        none waiting."""
        if not self._waiting_since:
            return 0.0
        return (asyncio.get_running_loop().time() - self._waiting_since[0]) * 1000

    def refuse_hurried(self, waiters: list[Waiter]) -> list[Waiter]:
        """While the line stands past the budget, answer the claims without a wait of
        `waiters` 429, let the long polls whose wait is over go (answered with
        nothing), and return the others, for a statement; else `waiters` as they are.
        A refused claim's carried completes are applied by its request (the claim's
        handler), as any refused claim's are."""
        if self.standing_ms() <= self._settings.db_queue_budget_ms:
            return waiters
        now = asyncio.get_running_loop().time()
        kept: list[Waiter] = []
        for waiter in waiters:
            if waiter.req.wait_seconds:
                if waiter.deadline > now:
                    kept.append(waiter)
                else:  # a long poll whose wait is over: answered with nothing, as usual
                    waiter.checked = True
                    waiter.poke()
                continue
            self._metrics.claims_rejected.labels("database_queue").inc()
            waiter.finish(
                error=Overloaded(
                    "claims have waited longer than GATEWAY_DB_QUEUE_BUDGET_MS "
                    f"({self._settings.db_queue_budget_ms:g} ms) for a database statement; "
                    "retry shortly"
                )
            )
        return kept

    @contextlib.asynccontextmanager
    async def hold(self, state: RuntimeState, claims: int) -> AsyncIterator[None]:
        """A slot for one of the runtime's statements, for `claims` claims, waited for
        in line; beyond GATEWAY_MAX_QUEUED_CLAIMS statements waiting, 429 at once (each
        claim counted). While it holds the slot, the statement counts in
        `state.running`."""
        if self._slots.locked():
            if len(self._waiting_since) >= self._settings.max_queued_claims:
                self._metrics.claims_rejected.labels("database_queue").inc(claims)
                raise Overloaded("too many claims are waiting for the database; retry shortly")
            since = asyncio.get_running_loop().time()
            self._waiting_since.append(since)
            try:
                await self._slots.acquire()
            finally:
                self._waiting_since.remove(since)
        else:
            await self._slots.acquire()
        try:
            state.running += 1
            yield
        finally:
            state.running -= 1
            self._slots.release()
