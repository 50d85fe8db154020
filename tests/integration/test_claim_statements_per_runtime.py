"""Claim statements per runtime (I9): polls that arrive while a runtime's claim
statement runs get a statement of their own, up to STATEMENTS_PER_RUNTIME at a time
and never more, and every task still goes to exactly one poll."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from gateway.claim import pump
from tests.support.claims import cancel_all, poll
from tests.support.gateways import make_settings, running_gateway

pytestmark = pytest.mark.integration

POLLS = 24
# Each statement is held this long before it runs, so that polls pile up behind it.
SLOW_SECONDS = 0.05


class Watched:
    """Counts the claim statements in flight, and the most seen at once."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0
        self.statements = 0

    def wrap(self, real: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def slowed(*args: Any, **kwargs: Any) -> Any:
            self.now += 1
            self.statements += 1
            self.most = max(self.most, self.now)
            try:
                await asyncio.sleep(SLOW_SECONDS)
                return await real(*args, **kwargs)
            finally:
                self.now -= 1

        return slowed


@pytest.mark.parametrize("bound", [1, 2, 3])
async def test_polls_arriving_during_a_statement_get_their_own_up_to_the_bound(
    database_url: str,
    redis_url: str,
    redis_prefix: str,
    runtime_id: str,
    monkeypatch: pytest.MonkeyPatch,
    bound: int,
) -> None:
    monkeypatch.setattr(pump, "STATEMENTS_PER_RUNTIME", bound)
    cfg = make_settings(database_url, redis_url, redis_prefix)
    async with running_gateway(cfg) as gw:
        store = gw.gateway.store
        watched = Watched()
        for name in ("claim", "claim_acked"):
            monkeypatch.setattr(store, name, watched.wrap(getattr(store, name)))
        tasks = {(await gw.enqueue(runtime_id, i))["id"] for i in range(POLLS)}
        # Polls arrive one by one while statements run.
        polls = []
        try:
            for i in range(POLLS):
                polls.append(
                    asyncio.create_task(poll(gw, runtime_id, f"w{i}", wait_seconds=5, max_tasks=1))
                )
                await asyncio.sleep(SLOW_SECONDS / 5)
            answers = await asyncio.wait_for(asyncio.gather(*polls), 20)
        finally:
            await cancel_all(polls)
    handed = [t["id"] for a in answers for t in a.tasks]
    assert all(a.status == 200 for a in answers), [a.body for a in answers if a.status != 200]
    assert sorted(handed) == sorted(tasks), "every task to exactly one poll"
    assert watched.most == bound, f"{watched.most} statements at once, bound {bound}"
