"""Background loops stop within a bound, even when a cancellation is swallowed (as
Python 3.11's asyncio.wait_for can do inside asyncpg and redis-py)."""

from __future__ import annotations

import asyncio
import logging
import time

from gateway.background import stop_task
from gateway.janitor import Janitor
from gateway.metrics import Metrics
from gateway.settings import Settings


async def test_stop_task_cancels_again_after_a_swallowed_cancellation() -> None:
    swallowed = 0

    async def stubborn() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                swallowed += 1
                if swallowed == 1:
                    continue  # lost, as wait_for on 3.11 may lose it
                raise

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    await asyncio.wait_for(stop_task(task, "stubborn", 2), 3)
    assert task.cancelled() and swallowed == 2


async def test_stop_task_gives_up_after_its_bound_and_says_so(caplog) -> None:
    keep_going = True

    async def immortal() -> None:
        while keep_going:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                continue

    task = asyncio.create_task(immortal())
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING, logger="gateway"):
        await asyncio.wait_for(stop_task(task, "immortal", 0.3), 2)
    assert not task.done()
    assert "immortal did not stop" in caplog.text
    keep_going = False
    task.cancel()
    await asyncio.wait({task}, timeout=1)
    assert task.done()


class LeaderlessStore:
    """Never gets the lock; its first call swallows a cancellation like 3.11 wait_for."""

    def __init__(self) -> None:
        self.calls = 0

    async def try_leadership(self, key: int) -> None:
        self.calls += 1
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            if self.calls > 1:
                raise
        return None


async def test_janitor_stop_returns_even_if_its_loop_lost_the_cancellation() -> None:
    store = LeaderlessStore()

    async def announce(runtime_id: str) -> None:
        return None

    settings = Settings(auth_enabled=False, janitor_interval_seconds=3600)
    janitor = Janitor(store, None, announce, settings, Metrics())  # type: ignore[arg-type]
    await janitor.start()
    await asyncio.sleep(0.01)  # inside try_leadership
    started = time.monotonic()
    await asyncio.wait_for(janitor.stop(), 3)
    assert time.monotonic() - started < 1.0, "stop waited for the loop's next pass"
    assert janitor._task is None
