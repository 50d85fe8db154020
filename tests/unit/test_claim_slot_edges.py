"""Edges of the claim slots' line and of claims whose client left (gateway/claim/slots.py,
waiters.still_wanted, give_backs.py): a departed claim's completes are applied and
nothing is leased for it; a long poll whose wait ran out in a standing line is answered,
not refused; each claim refused for a full line is counted; and one slow give-back does
not hold up another runtime's claims."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from gateway.admission import Caller
from gateway.claim.waiters import Carried, Departure
from gateway.errors import Overloaded
from tests.support.gated_claims import GatedClaimStore, leased_task, make_claimer, settle
from tests.support.gated_claims import claim_request as req

BUDGET_MS = 50.0


async def test_a_departed_claim_has_its_completes_applied_and_nothing_leased_for_it() -> None:
    """A worker reports its completes with its next claim: when that claim's client
    leaves while it waits for a slot, its completes still go in (its worker did the
    tasks), but no task is leased for it only to be given back."""
    store = GatedClaimStore(lease=True)
    claimer, _ = make_claimer(store)
    store.open("other")
    holder_gate = asyncio.Event()
    store.gates["other"] = holder_gate
    holder = asyncio.create_task(claimer.claim("other", req()))  # holds the one slot
    await settle()
    left = Caller()
    carried = Carried([uuid.uuid4()], [uuid.uuid4()], [None], None, settle=lambda o: o)
    claim = asyncio.create_task(claimer.claim("rt", req(max_tasks=10), None, carried, left))
    await settle()
    left.leave()  # its connection closed while it waited for a claim slot
    holder_gate.set()
    store.open("rt")
    await asyncio.wait_for(asyncio.gather(holder, claim), 5)
    await settle()
    assert carried.answer is not None, "its completes were not applied"
    assert store.gone_claims == 1
    rt_claims = [n for rt, n in store.claims if rt == "rt"]
    given_back = sum(len(ids) for ids in store.unclaims)
    assert rt_claims == [0] and given_back == 0, (
        f"a departed claim was claimed for: statement asked for {rt_claims} rows, "
        f"{given_back} leases then given back"
    )


async def test_a_long_poll_whose_wait_ran_out_in_a_standing_line_is_answered_not_refused() -> None:
    """A long poll that arrives while its runtime's pump waits in a standing line gets
    no statement until the pump's returns; if its wait ran out meanwhile, it is
    answered with nothing, as at any deadline, never 429 for the slots."""
    store = GatedClaimStore(lease=True)
    claimer, _ = make_claimer(store, db_queue_budget_ms=BUDGET_MS)
    holder = asyncio.create_task(claimer.claim("other", req()))  # holds the one slot
    await settle()
    first = asyncio.create_task(claimer.claim("rt", req()))  # rt's pump: first in line
    await settle()
    poll = asyncio.create_task(claimer.claim("rt", req(wait=0.1)))  # waits for rt's pump
    await settle()
    third = asyncio.create_task(claimer.claim("third", req()))  # second in line
    fourth = asyncio.create_task(claimer.claim("fourth", req()))  # third in line
    await settle()
    await asyncio.sleep(0.3)  # the poll's wait is over; the line stands past the budget
    store.open("other")
    store.open("rt")  # rt's statement runs and returns; third and fourth still wait
    await settle()  # rt's pump cycles again (refuse_hurried runs now)
    store.open("third")
    store.open("fourth")
    await asyncio.wait_for(asyncio.gather(holder, first, third, fourth), 5)
    try:
        result = await asyncio.wait_for(poll, 5)
    except Overloaded as exc:
        pytest.fail(f"a long poll was refused 429: {exc.detail}")
    assert isinstance(result, list)


async def test_each_claim_refused_for_a_full_line_is_counted() -> None:
    """gateway_claims_rejected_total counts claims answered 429: a statement refused
    for GATEWAY_MAX_QUEUED_CLAIMS answers each of its claims, and counts each."""
    store = GatedClaimStore(lease=True)
    claimer, metrics = make_claimer(store, max_queued_claims=1)
    holder = asyncio.create_task(claimer.claim("other", req()))
    await settle()
    queued = asyncio.create_task(claimer.claim("q", req()))  # fills the queue
    await settle()
    # Two claims of one runtime arriving together: one statement, both refused.
    a = asyncio.create_task(claimer.claim("rt", req()))
    b = asyncio.create_task(claimer.claim("rt", req()))
    results = await asyncio.wait_for(asyncio.gather(a, b, return_exceptions=True), 5)
    refused = sum(isinstance(r, Overloaded) for r in results)
    counted = metrics.claims_rejected.labels("database_queue")._value.get()
    for rt in ("other", "q"):
        store.open(rt)
    await asyncio.wait_for(asyncio.gather(holder, queued), 5)
    assert refused == 2
    assert counted == refused, f"{refused} claims answered 429, {counted} counted"


async def test_a_slow_give_back_does_not_hold_up_another_runtimes_claims() -> None:
    """Give-backs share one statement at a time for the whole process: a pump whose
    statement leased a task for a poll that left queues its give-back and goes on, so
    runtime B's claims never wait for runtime A's slow give-back statement."""

    store = GatedClaimStore(lease=True)
    slow = asyncio.Event()
    slow_ids: set[uuid.UUID] = set()
    plain_unclaim = store.unclaim

    async def unclaim(task_ids: Any, lease_ids: Any) -> list[uuid.UUID]:
        if slow_ids & set(task_ids):
            await slow.wait()  # e.g. a connection wait or a row lock held elsewhere
        return await plain_unclaim(task_ids, lease_ids)

    store.unclaim = unclaim  # type: ignore[method-assign]
    claimer, _ = make_claimer(store, max_concurrent_claims=4)
    # Runtime A: a give-back whose statement is slow.
    a_task = leased_task()
    slow_ids.add(a_task.id)
    a_back = asyncio.create_task(claimer.give_back("A", [a_task]))
    await settle()
    # Runtime B: a long poll whose client leaves while its statement runs.
    departure = Departure()
    poll = asyncio.create_task(claimer.claim("B", req(wait=30.0), departure))
    await settle()
    departure.set()
    store.open("B")  # its statement leases a task for it: given back in _hand_out
    await settle()
    try:
        # A client of B still there claims now.
        rows = await asyncio.wait_for(claimer.claim("B", req()), 1.0)
    except TimeoutError:
        pytest.fail("runtime B's claim waited on runtime A's give-back statement")
    finally:
        slow.set()
        await asyncio.wait_for(asyncio.gather(a_back, poll), 5)
    assert rows
