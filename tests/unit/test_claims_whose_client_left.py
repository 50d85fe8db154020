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
from gateway.api.requests import ClaimRequest
from gateway.claim.claimer import Claimer
from gateway.claim.waiters import Carried, Departure
from gateway.metrics import Metrics
from gateway.rows import ItemResult
from gateway.settings import Settings
from tests.sim.fakes import FakeWakeChannels, NoCache


class Store:
    """Claims wait for their runtime's gate; unclaims wait for `unclaim_gate`. Records
    every statement."""

    def __init__(self) -> None:
        self.gates: dict[str, asyncio.Event] = {}
        self.claims: list[tuple[str, int]] = []
        self.acked: list[list[uuid.UUID]] = []
        self.unclaims: list[list[uuid.UUID]] = []
        self.unclaim_gate = asyncio.Event()
        self.unclaim_gate.set()

    def open(self, runtime_id: str) -> None:
        self.gates.setdefault(runtime_id, asyncio.Event()).set()

    def client_gone(self, claims: int) -> None:
        self.gone_claims = getattr(self, "gone_claims", 0) + claims

    def crowded(self) -> bool:
        return False

    def connection_free(self) -> bool:
        return True

    async def claim(self, runtime_id: str, workers: Any, leases: Any) -> Any:
        self.claims.append((runtime_id, len(workers)))
        await self.gates.setdefault(runtime_id, asyncio.Event()).wait()
        return [], None

    async def claim_acked(self, runtime_id: str, workers: Any, leases: Any, completes: Any) -> Any:
        self.acked.append(list(completes.task_ids))
        rows, due_in = await self.claim(runtime_id, workers, leases)
        return rows, due_in, [ItemResult(t, runtime_id, "completed") for t in completes.task_ids]

    async def unclaim(self, task_ids: Any, lease_ids: Any) -> list[uuid.UUID]:
        await self.unclaim_gate.wait()
        self.unclaims.append(list(task_ids))
        return list(task_ids)


def make(store: Store) -> tuple[Claimer, Metrics]:
    metrics = Metrics()
    cfg = Settings(cache_enabled=False, max_concurrent_claims=1)
    claimer = Claimer(store, NoCache(), FakeWakeChannels("t"), cfg, metrics)  # type: ignore[arg-type]
    return claimer, metrics


def req(wait: float = 0.0) -> ClaimRequest:
    return ClaimRequest(worker_id="w", max_tasks=1, wait_seconds=wait, lease_seconds=60)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_a_claim_whose_connection_closed_while_it_waited_for_a_slot_is_not_claimed_for() -> (
    None
):
    store = Store()
    claimer, _ = make(store)
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
    assert [rt for rt, _ in store.claims] == ["other", "rt-b"], (
        "a statement ran for a claim whose client had left"
    )
    assert store.gone_claims == 1


async def test_a_long_poll_that_left_while_waiting_for_a_slot_is_not_claimed_for() -> None:
    store = Store()
    claimer, _ = make(store)
    holder = asyncio.create_task(claimer.claim("other", req()))
    await settle()
    departure = Departure()
    poll = asyncio.create_task(claimer.claim("rt", req(wait=30.0), departure))
    await settle()
    departure.set()  # its client disconnected
    store.open("other")
    assert await asyncio.wait_for(poll, 5) == []
    await asyncio.wait_for(holder, 5)
    assert [rt for rt, _ in store.claims] == ["other"]


async def test_completes_carried_by_a_claim_whose_client_left_are_still_applied() -> None:
    store = Store()
    claimer, _ = make(store)
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
    store = Store()
    claimer, _ = make(store)
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
