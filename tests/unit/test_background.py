"""Background loops stop within a bound, even when a cancellation is swallowed (as
Python 3.11's asyncio.wait_for can do inside asyncpg and redis-py)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from gateway.background import stop_task
from gateway.errors import StoreUnavailable
from gateway.janitor import Janitor
from gateway.metrics import Metrics
from gateway.settings import Settings
from tests.support.metrics import sample


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


async def started_janitor(store: Any) -> tuple[Janitor, Metrics]:
    """A janitor over `store` with a pass every 10 ms, started; and its metrics."""

    async def announce(runtime_id: str) -> None:
        return None

    metrics = Metrics()
    settings = Settings(auth_enabled=False, janitor_interval_seconds=0.01)
    janitor = Janitor(store, None, announce, settings, metrics)
    await janitor.start()
    return janitor, metrics


class UnreachableStore:
    """A database that refuses every connection, then answers again once `back`."""

    def __init__(self) -> None:
        self.back = False
        self.tries = 0

    async def try_leadership(self, key: int) -> None:
        self.tries += 1
        if not self.back:
            raise StoreUnavailable("cannot connect to Postgres: refused")
        return None


async def test_the_janitor_reports_whether_this_instance_reaches_postgres(caplog) -> None:
    """Every instance's janitor tries Postgres once per interval: gateway_database_reachable
    says what it found (the input of the alert on an instance cut off from Postgres), and
    the failure is one warning line, no traceback."""
    store = UnreachableStore()
    janitor, metrics = await started_janitor(store)
    try:
        while store.tries < 2:
            await asyncio.sleep(0.01)
        assert sample(metrics, "gateway_database_reachable") == 0
        store.back = True
        tried = store.tries
        while store.tries < tried + 2:
            await asyncio.sleep(0.01)
        assert sample(metrics, "gateway_database_reachable") == 1
    finally:
        await janitor.stop()
    failures = [r for r in caplog.records if "database is unavailable" in r.getMessage()]
    assert failures and all(r.exc_info is None for r in failures)


class LeaderButUnreachableStore:
    """This instance holds the janitor's lock, and every statement of a pass fails as
    when Postgres is stopped (each step catches its failure)."""

    class Lock:
        async def held(self) -> bool:
            return True

        async def release(self) -> None:
            return None

    def __init__(self) -> None:
        self.statements = 0

    async def try_leadership(self, key: int) -> Any:
        return self.Lock()

    def __getattr__(self, name: str) -> Any:
        async def unreachable(*args: Any, **kwargs: Any) -> Any:
            self.statements += 1
            raise StoreUnavailable("cannot connect to Postgres: refused")

        return unreachable


async def test_a_leaders_pass_whose_statements_all_fail_says_postgres_is_unreachable() -> None:
    """Each of a pass's steps catches its own failure: the pass still ended, but it did
    not reach Postgres, and the gauge must say so (it said 1, and a readiness probe's 0
    was overwritten within an interval)."""
    store = LeaderButUnreachableStore()
    janitor, metrics = await started_janitor(store)
    try:
        while store.statements < 20:
            await asyncio.sleep(0.01)
        assert sample(metrics, "gateway_database_reachable") == 0
    finally:
        await janitor.stop()
