"""The claim pump's helpers (gateway/claim/pump.py, STATEMENTS_PER_RUNTIME) under
overload and failure: a second statement per runtime starts only beside one that holds
a claim slot, a coroutine that dies answers only the polls no other statement serves,
and the pump sleeps while a helper holds every poll."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.api.requests import ClaimRequest
from gateway.claim import pump
from gateway.claim.claimer import Claimer
from gateway.claim.waiters import Waiter
from gateway.errors import Overloaded, StoreUnavailable
from gateway.metrics import Metrics
from gateway.rows import Leased
from gateway.settings import Settings
from tests.sim.fakes import FakeWakeChannels, NoCache


class GatedStore:
    """Each claim waits for its runtime's gate; `script` may replace a call's behaviour."""

    def __init__(self) -> None:
        self.gates: dict[str, asyncio.Event] = {}
        self.calls: list[str] = []
        self.unclaimed: list[uuid.UUID] = []
        self.script: list[Any] = []

    def client_gone(self, claims: int) -> None:
        self.gone_claims = getattr(self, "gone_claims", 0) + claims

    def crowded(self) -> bool:
        return False

    def connection_free(self) -> bool:
        return True

    async def claim(self, runtime_id: str, workers: Any, leases: Any) -> Any:
        self.calls.append(runtime_id)
        if self.script:
            step = self.script.pop(0)
            return await step(runtime_id, workers)
        await self.gates.setdefault(runtime_id, asyncio.Event()).wait()
        return [], None

    async def unclaim(self, task_ids: Any, lease_ids: Any) -> list[uuid.UUID]:
        self.unclaimed += list(task_ids)
        return list(task_ids)


def make(store: GatedStore, **settings: Any) -> Claimer:
    cfg = Settings(cache_enabled=False, **settings)
    return Claimer(store, NoCache(), FakeWakeChannels("t"), cfg, Metrics())  # type: ignore[arg-type]


def req(worker: str, wait: float = 5.0) -> ClaimRequest:
    return ClaimRequest(worker_id=worker, max_tasks=1, wait_seconds=wait, lease_seconds=60)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


@pytest.mark.parametrize("bound", [1, 2])
async def test_a_poll_arriving_while_its_pump_waits_for_a_claim_slot_is_not_refused(
    monkeypatch: pytest.MonkeyPatch, bound: int
) -> None:
    """With every claim slot of the process taken, a runtime's pump waits in the claims'
    queue. A poll that arrives then used to park for the pump's next statement; with a
    helper it queues a second statement, which a full queue refuses with 429."""
    monkeypatch.setattr(pump, "STATEMENTS_PER_RUNTIME", bound)
    store = GatedStore()
    claimer = make(store, max_concurrent_claims=1, max_queued_claims=1)
    other = asyncio.create_task(claimer.claim("other", req("x", 0.0)))  # holds the one slot
    await settle()
    first = asyncio.create_task(claimer.claim("rt", req("a")))  # rt's pump: queued
    await settle()
    second = asyncio.create_task(claimer.claim("rt", req("b")))  # arrives meanwhile
    await settle()
    refused = second.done() and isinstance(second.exception(), Overloaded)
    store.gates.setdefault("other", asyncio.Event()).set()
    store.gates.setdefault("rt", asyncio.Event()).set()
    claimer.drain()
    await asyncio.gather(other, first, second, return_exceptions=True)
    assert not refused, "a poll was refused 429 only because its pump's statement was queued"


async def test_a_helper_that_dies_does_not_answer_the_polls_of_the_pumps_statement() -> None:
    """A helper's death fails every waiter of the runtime, including those whose
    statement, the pump's, is still running and then leases them a task: the poll is
    answered 503 and, when its statement ends in the same turn of the loop, the task it
    was handed is neither delivered nor given back (its lease must lapse)."""
    store = GatedStore()
    claimer = make(store)
    task_id = uuid.uuid4()
    pumps_statement = asyncio.Event()

    async def pumps(runtime_id: str, workers: Any) -> Any:
        await pumps_statement.wait()
        row = SimpleNamespace(id=task_id, lease_id=uuid.uuid4(), created_at=None)
        return [Leased(1, row)], None  # type: ignore[arg-type]

    async def helpers(runtime_id: str, workers: Any) -> Any:
        pumps_statement.set()  # the pump's statement ends in this same turn
        raise RuntimeError("a bug in the helper's cycle")

    store.script = [pumps, helpers]
    claimer._metrics.observe_claim_delay = lambda *a: None  # type: ignore[method-assign]
    first = asyncio.create_task(claimer.claim("rt", req("a")))
    await settle()
    second = asyncio.create_task(claimer.claim("rt", req("b")))
    results = await asyncio.wait_for(asyncio.gather(first, second, return_exceptions=True), 5)
    first_result = results[0]
    delivered = isinstance(first_result, list) and [r.task.id for r in first_result] == [task_id]
    assert delivered or task_id in store.unclaimed, (
        f"the pump's poll got {first_result!r}; its task was neither delivered nor given back"
    )
    assert not isinstance(first_result, StoreUnavailable)


async def test_the_pump_does_not_spin_while_a_helper_holds_every_poll() -> None:
    """Every poll is in a helper's statement and the verdict this process wrote is due
    for renewal: the pump parks until the helper wakes it, not for a millisecond."""
    store = GatedStore()
    claimer = make(store)
    state = claimer._state("rt")
    waiter = Waiter(req=req("a"), deadline=asyncio.get_running_loop().time() + 5)
    waiter.in_flight = True  # in the helper's statement
    state.waiters.append(waiter)
    state.renew_version = "v"
    state.renew_at = asyncio.get_running_loop().time() - 1.0  # renewal due
    park = await claimer._pumps._cycle(state)
    assert park is not None and park >= 0.05, f"the pump parks {park} s, then cycles again"
