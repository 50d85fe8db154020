"""The bound on one process's Redis command connections (GATEWAY_REDIS_MAX_CONNECTIONS).

The command client's pool is capped at that many connections (per node in a cluster),
and `CallSlots` lets at most that many calls be in flight at once: a call beyond the
bound waits for one to finish instead of opening a connection of its own.

The waiting is done here, the same in every mode, rather than by redis-py's pools: a
Sentinel pool and a cluster node refuse a call at once (`MaxConnectionsError`) when
full, and the one pool that waits (`BlockingConnectionPool`, one server only) ends a
wait with a plain ConnectionError that cannot be told from a network failure. One
VerdictCache call holds at most one connection per node at a time (its commands are
sequential, a cluster pipeline uses one connection per node), so N slots never need
more than N connections of any node's pool.
"""

from __future__ import annotations

import asyncio


class PoolBusy(Exception):
    """Every command connection stayed busy for the whole wait: the call was not sent."""


class CallSlots:
    """At most `size` Redis calls of this process in flight at once, served in the
    order they arrived."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("size must be at least 1")
        self.size = size
        self.in_use = 0  # calls holding a slot now
        self._free = asyncio.Semaphore(size)

    async def acquire(self, wait_seconds: float) -> None:
        """Take a slot, waiting up to `wait_seconds` for one; PoolBusy when none came
        free. Pair every successful call with `release()`."""
        if self._free.locked():
            try:
                async with asyncio.timeout(wait_seconds):
                    await self._free.acquire()
            except TimeoutError:
                raise PoolBusy(
                    f"all {self.size} Redis connections busy for {wait_seconds * 1000:.0f} ms"
                ) from None
        else:
            # No waiter and a free slot: taken without suspending and without a timer.
            await self._free.acquire()
        self.in_use += 1

    def release(self) -> None:
        self.in_use -= 1
        self._free.release()
