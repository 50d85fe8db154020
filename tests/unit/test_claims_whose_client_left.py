"""Claims whose client left while they waited for a claim slot (gateway/claim/pump.py,
waiters.still_wanted), and the leases that claims leave behind when their clients go at
once (Claimer.give_back, gateway/claim/give_backs.py). At the end of a flood, both used
to put a second of statements for departed clients ahead of the clients still there."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace
from typing import Any

from gateway.admission import Caller
from gateway.claim.waiters import Carried, Departure
from tests.support.gated_claims import GatedClaimStore, make_claimer, settle
from tests.support.gated_claims import claim_request as req


async def test_a_claim_whose_connection_closed_while_it_waited_for_a_slot_is_not_claimed_for() -> (
    None
):
    store = GatedClaimStore()
    claimer, _ = make_claimer(store)
    holder = asyncio.create_task(claimer.claim("other", req()))  # holds the one claim slot
    await settle()
    left, stays = Caller(), Caller()
    gone = asyncio.create_task(claimer.claim("rt-a", req(), caller=left))
    there = asyncio.create_task(claimer.claim("rt-b", req(), caller=stays))
    await settle()
    left.leave()  # the HTTP protocol saw its connection close
    store.open("other")
    store.open("rt-b")
    assert await asyncio.wait_for(gone, 5) == []
    await asyncio.wait_for(asyncio.gather(holder, there), 5)
    assert store.runtimes_claimed() == ["other", "rt-b"], (
        "a statement ran for a claim whose client had left"
    )
    assert store.gone_claims == 1


async def test_a_long_poll_that_left_while_waiting_for_a_slot_is_not_claimed_for() -> None:
    store = GatedClaimStore()
    claimer, _ = make_claimer(store)
    holder = asyncio.create_task(claimer.claim("other", req()))
    await settle()
    departure = Departure()
    poll = asyncio.create_task(claimer.claim("rt", req(wait=30.0), departure))
    await settle()
    departure.set()  # its client disconnected
    store.open("other")
    assert await asyncio.wait_for(poll, 5) == []
    await asyncio.wait_for(holder, 5)
    assert store.runtimes_claimed() == ["other"]


async def test_completes_carried_by_a_claim_whose_client_left_are_still_applied() -> None:
    store = GatedClaimStore()
    claimer, _ = make_claimer(store)
    holder = asyncio.create_task(claimer.claim("other", req()))
    await settle()
    left = Caller()
    done = [uuid.uuid4()]
    carried = Carried(done, [uuid.uuid4()], [None], None, settle=lambda outcomes: outcomes)
    claim = asyncio.create_task(claimer.claim("rt", req(), None, carried, left))
    await settle()
    left.leave()
    for runtime in ("other", "rt"):
        store.open(runtime)
    await asyncio.wait_for(asyncio.gather(holder, claim), 5)
    assert store.acked == [done], "its worker finished that task: the complete must go in"
    assert carried.answer is not None


async def test_leases_given_back_together_share_one_statement() -> None:
    store = GatedClaimStore()
    claimer, _ = make_claimer(store)
    store.unclaim_gate.clear()

    def rows(n: int) -> list[Any]:
        return [SimpleNamespace(id=uuid.uuid4(), lease_id=uuid.uuid4()) for _ in range(n)]

    first = asyncio.create_task(claimer.give_back("rt-0", rows(1)))
    await settle()
    flood = [asyncio.create_task(claimer.give_back(f"rt-{k % 5}", rows(1))) for k in range(200)]
    await settle()
    store.unclaim_gate.set()
    await asyncio.wait_for(asyncio.gather(first, *flood), 5)
    assert [len(ids) for ids in store.unclaims] == [1, 200], (
        "each claim whose client left gave its leases back in a statement of its own"
    )
