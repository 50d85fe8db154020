"""The claim statements' line (gateway/claim/slots.py): while the statement first in line
has waited past GATEWAY_DB_QUEUE_BUDGET_MS for a claim slot, a claim without a wait is
answered 429 at once, a long poll is not, and once the line drains the next claim is
let in again (nothing learnt from the slow period keeps refusing)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.claim.claimer import Claimer
from gateway.errors import Overloaded
from gateway.metrics import Metrics
from tests.support.gated_claims import GatedClaimStore, make_claimer, settle
from tests.support.gated_claims import claim_request as req

BUDGET_MS = 50.0


def make(store: GatedClaimStore) -> tuple[Claimer, Metrics]:
    return make_claimer(store, db_queue_budget_ms=BUDGET_MS)


def rejected(metrics: Metrics) -> float:
    return metrics.claims_rejected.labels("database_queue")._value.get()


async def test_while_the_line_stands_a_claim_without_a_wait_is_refused_and_a_long_poll_is_not() -> (
    None
):
    store = GatedClaimStore()
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
    assert "hurried" not in store.runtimes_claimed()
    assert store.runtimes_claimed()[:2] == ["holder", "queued"], "what was in line was served"


async def test_once_the_line_drains_claims_are_let_in_again() -> None:
    """The refusal reads the line as it is now: after a long-standing line ends, the
    next claim gets its statement (a mean of past statements would keep refusing)."""
    store = GatedClaimStore()
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
    assert store.runtimes_claimed()[-1] == "after"


async def test_a_line_within_the_budget_refuses_nothing() -> None:
    store = GatedClaimStore()
    claimer, metrics = make(store)
    holder = asyncio.create_task(claimer.claim("holder", req()))
    await settle()
    queued = [asyncio.create_task(claimer.claim(f"rt-{k}", req())) for k in range(5)]
    await settle()
    for runtime in ["holder"] + [f"rt-{k}" for k in range(5)]:
        store.open(runtime)
    await asyncio.wait_for(asyncio.gather(holder, *queued), 5)
    assert rejected(metrics) == 0
    assert sorted(store.runtimes_claimed()) == sorted(["holder"] + [f"rt-{k}" for k in range(5)])
