"""Announcements of claimable work (I1), bumped in Redis together.

Every commit that makes tasks claimable (an enqueue, a fail or release that queues a
task again, a retry) announces its runtime: its version is bumped in Redis, with a
wake-up published, and this process's pump of the runtime is woken. A bump is one
Redis round trip, and on a loopback connection the system calls of that round trip
cost more than the rest of it: about 75 us of CPU a bump, and under a flood of single
enqueues bumps were about 7% of the gateway's CPU.

So the bumps of announcements made while another bump is on its way are sent together,
in one pipeline (VerdictCache.bump_many), once it is back: one round trip for any
number of runtimes, a runtime announced several times bumped once. Each announcement
is made after its commit and waits for a bump sent after it was made, so the bump
still follows the commit (I1). Alone, an announcement is sent at once, as one bump:
grouping adds no wait, it only forms while a round trip is already on its way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from .. import admission, logs
from ..errors import CacheUnavailable
from .ports import ClaimCache

log = logging.getLogger("gateway.claim")

# What to do once a runtime's bump is back: wake its pump here, with the version the
# bump made (None: the bump was lost; the janitor's repair pass finds it, I6).
Woken = Callable[[str, str | None], None]


class Announcements:
    """The announcements of one process, and the one task that sends their bumps.
    Owned by the Claimer; `close` sends what is left."""

    def __init__(self, cache: ClaimCache, woken: Woken) -> None:
        self._cache = cache
        self._woken = woken
        # Announcements waiting for the next round trip: each runtime's waiters.
        self._pending: dict[str, list[asyncio.Future[None]]] = {}
        self._sender: asyncio.Task[None] | None = None

    def announce(self, runtime_id: str) -> asyncio.Future[None]:
        """Bump the runtime's version after a commit that made tasks claimable, and
        wake its pump here. The future is done once a bump made after this call is
        back (or lost: a lost bump is logged and counted, never raised)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._pending.setdefault(runtime_id, []).append(done)
        sender = self._sender
        # (A sender of another loop is one a test's closed loop left behind.)
        if sender is None or sender.get_loop() is not loop:
            self._sender = loop.create_task(self._send(), name="announcements")
        return done

    async def _send(self) -> None:
        """Bump until nothing is pending; announcements made during a round trip go in
        the next one. Cancelled (the loop ends), the announcements it leaves are done
        without their bump: each lost bump is one the janitor's repair pass finds (I6),
        and nobody waits for ever."""
        logs.detach()  # started by one request, it sends for many
        admission.detach()
        batch: dict[str, list[asyncio.Future[None]]] = {}
        try:
            while self._pending:
                batch, self._pending = self._pending, {}
                await self.bump_now(list(batch))
                _done(batch)
        finally:
            if asyncio.current_task() is self._sender:
                self._sender = None
            _done(batch)
            _done(self._pending)

    async def bump_now(self, runtime_ids: Sequence[str]) -> None:
        """Bump each runtime (distinct) in one round trip now, not waiting for a round
        trip on its way, and wake its pump here: for a commit that made tasks in many
        runtimes at once (a tick pass's batch, give-backs), already one group. A lost
        bump is logged and counted, never raised."""
        versions: list[str | None]
        try:
            if len(runtime_ids) == 1:  # a pipeline costs more than one call
                versions = [await self._cache.bump(runtime_ids[0])]
            else:
                versions = await self._cache.bump_many(runtime_ids)
        except CacheUnavailable as exc:
            log.warning(
                "version bumps lost for runtimes %s: %s", ", ".join(runtime_ids[:10]), exc.detail
            )
            versions = [None] * len(runtime_ids)
        except Exception:
            log.exception("version bumps failed for runtimes %s", ", ".join(runtime_ids[:10]))
            versions = [None] * len(runtime_ids)
        lost = [rt for rt, v in zip(runtime_ids, versions, strict=True) if v is None]
        if lost and len(lost) < len(runtime_ids):
            log.warning("version bumps lost for runtimes %s", ", ".join(lost[:10]))
        for runtime_id, version in zip(runtime_ids, versions, strict=True):
            try:
                self._woken(runtime_id, version)
            except Exception:
                log.exception("waking the pump of runtime %s failed", runtime_id)

    async def close(self) -> None:
        """Wait until the bumps announced so far are sent (each bounded by the Redis
        call's own budget)."""
        while self._sender is not None:
            await asyncio.shield(self._sender)


def _done(waiting: dict[str, list[asyncio.Future[None]]]) -> None:
    for waiters in waiting.values():
        for done in waiters:
            if not done.done():
                done.set_result(None)
