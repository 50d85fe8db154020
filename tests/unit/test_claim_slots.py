"""The claim statements' line (gateway/claim/slots.py): while the statement first in line
has waited past GATEWAY_DB_QUEUE_BUDGET_MS for a claim slot, a claim without a wait is
answered 429 at once, a long poll is not, and once the line drains the next claim is
let in again (nothing learnt from the slow period keeps refusing)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.api.requests import ClaimRequest
from gateway.claim.claimer import Claimer
from gateway.errors import Overloaded
from gateway.metrics import Metrics
from gateway.settings import Settings
from tests.sim.fakes import FakeWakeChannels, NoCache

BUDGET_MS = 50.0


class Store:
    """Each claim statement waits for its runtime's gate."""

    def __init__(self) -> None:
        self.gates: dict[str, asyncio.Event] = {}
        self.claims: list[str] = []

    def open(self, runtime_id: str) -> None:
        self.gates.setdefault(runtime_id, asyncio.Event()).set()

    def client_gone(self, claims: int) -> None:
        self.gone_claims = getattr(self, "gone_claims", 0) + claims

    def crowded(self) -> bool:
        return False

    def connection_free(self) -> bool:
        return True

    async def claim(self, runtime_id: str, workers: Any, leases: Any) -> Any:
        self.claims.append(runtime_id)
        await self.gates.setdefault(runtime_id, asyncio.Event()).wait()
        return [], None

    async def unclaim(self, task_ids: Any, lease_ids: Any) -> list[Any]:
        return list(task_ids)


def make(store: Store) -> tuple[Claimer, Metrics]:
    metrics = Metrics()
    cfg = Settings(cache_enabled=False, max_concurrent_claims=1, db_queue_budget_ms=BUDGET_MS)
    claimer = Claimer(store, NoCache(), FakeWakeChannels("t"), cfg, metrics)  # type: ignore[arg-type]
    return claimer, metrics


def req(wait: float = 0.0) -> ClaimRequest:
    return ClaimRequest(worker_id="w", max_tasks=1, wait_seconds=wait, lease_seconds=60)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def rejected(metrics: Metrics) -> float:
    return metrics.claims_rejected.labels("database_queue")._value.get()


async def test_while_the_line_stands_a_claim_without_a_wait_is_refused_and_a_long_poll_is_not() -> (
    None
):
    store = Store()
    claimer, metrics = make(store)
    holder = asyncio.create_task(claimer.claim("holder", req()))  # the one slot
    await settle()
    queued = asyncio.create_task(claimer.claim("queued", req()))  # first in line
    await settle()
    await asyncio.sleep(BUDGET_MS / 1000 * 2)  # it has now waited past the budget
    with pytest.raises(Overloaded):
        await asyncio.wait_for(claimer.claim("hurried", req()), 1)
    poll = asyncio.create_task(claimer.claim("poll", req(wait=30.0)))
    await settle()
    assert not poll.done(), "a long poll was refused: it has time to wait"
    assert rejected(metrics) == 1
    for runtime in ("holder", "queued", "poll"):
        store.open(runtime)
    await asyncio.wait_for(asyncio.gather(holder, queued), 5)
    claimer.drain()
    assert await asyncio.wait_for(poll, 5) == []
    assert "hurried" not in store.claims
    assert store.claims[:2] == ["holder", "queued"], "what was in line was served"


async def test_once_the_line_drains_claims_are_let_in_again() -> None:
    """The refusal reads the line as it is now: after a long-standing line ends, the
    next claim gets its statement (a mean of past statements would keep refusing)."""
    store = Store()
    claimer, _ = make(store)
    holder = asyncio.create_task(claimer.claim("holder", req()))
    await settle()
    queued = asyncio.create_task(claimer.claim("queued", req()))
    await settle()
    await asyncio.sleep(BUDGET_MS / 1000 * 4)
    with pytest.raises(Overloaded):
        await asyncio.wait_for(claimer.claim("hurried", req()), 1)
    store.open("holder")
    store.open("queued")
    await asyncio.wait_for(asyncio.gather(holder, queued), 5)
    store.open("after")
    assert await asyncio.wait_for(claimer.claim("after", req()), 1) == []
    assert store.claims[-1] == "after"


async def test_a_line_within_the_budget_refuses_nothing() -> None:
    store = Store()
    claimer, metrics = make(store)
    holder = asyncio.create_task(claimer.claim("holder", req()))
    await settle()
    queued = [asyncio.create_task(claimer.claim(f"rt-{k}", req())) for k in range(5)]
    await settle()
    for runtime in ["holder"] + [f"rt-{k}" for k in range(5)]:
        store.open(runtime)
    await asyncio.wait_for(asyncio.gather(holder, *queued), 5)
    assert rejected(metrics) == 0
    assert sorted(store.claims) == sorted(["holder"] + [f"rt-{k}" for k in range(5)])
