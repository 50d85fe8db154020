"""How a claim pump gathers the completes its claims carry into one statement
(gateway/claim/pump.py): a claim whose completes name a task an earlier claim's do, or
would take the statement past CARRIED_MAX, waits for the next statement; each item goes
with its own claim's runtime patterns; each claim gets back exactly its own items'
outcomes, in order; and against the database's line (gateway/admission.py), the
completes go as completes do, while the claim never jumps the line with them."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

from gateway.admission import Priority, priority
from gateway.api.requests import ClaimRequest
from gateway.claim.claimer import Claimer
from gateway.claim.waiters import CARRIED_MAX, Carried, Waiter, fit_statement, merged, share
from gateway.metrics import Metrics
from gateway.rows import ItemResult
from gateway.settings import Settings
from tests.sim.fakes import FakeWakeChannels, NoCache


def waiter(ids: list[uuid.UUID] | None, runtimes: tuple[str, ...] | None = None) -> Waiter:
    req = ClaimRequest(worker_id="w", max_tasks=1, wait_seconds=0.0, lease_seconds=60)
    carried = None
    if ids is not None:
        carried = Carried(
            list(ids),
            [uuid.uuid4() for _ in ids],
            [None] * len(ids),
            runtimes,
            lambda outcomes: [o.status for o in outcomes],
        )
    return Waiter(req=req, deadline=0.0, carried=carried)


def test_a_claim_naming_a_task_an_earlier_claim_names_waits_for_the_next_statement() -> None:
    a, b = uuid.uuid4(), uuid.uuid4()
    first, plain, again, other = waiter([a, b]), waiter(None), waiter([b]), waiter([uuid.uuid4()])
    taken, later = fit_statement([first, plain, again, other])
    assert taken == [first, plain, other] and later == [again]


def test_claims_past_the_bound_wait_but_the_first_always_goes() -> None:
    big = waiter([uuid.uuid4() for _ in range(CARRIED_MAX)])
    small = waiter([uuid.uuid4()])
    assert fit_statement([big, small]) == ([big], [small])
    alone = waiter([uuid.uuid4() for _ in range(CARRIED_MAX + 1)])
    assert fit_statement([alone]) == ([alone], [])
    fits = [waiter([uuid.uuid4() for _ in range(CARRIED_MAX // 2)]) for _ in range(2)]
    assert fit_statement(fits) == (fits, [])


def test_a_claim_whose_completes_are_applied_no_longer_counts() -> None:
    a = uuid.uuid4()
    done = waiter([a])
    assert done.carried is not None
    done.carried.answer = "applied"
    pending = waiter([a])
    assert fit_statement([done, pending]) == ([done, pending], [])


def test_each_item_carries_its_claims_patterns_and_each_claim_gets_its_own_outcomes() -> None:
    one, two = waiter([uuid.uuid4(), uuid.uuid4()], ("a-*",)), waiter([uuid.uuid4()])
    statement = merged([one, two])
    assert one.carried is not None and two.carried is not None
    assert list(statement.task_ids) == one.carried.task_ids + two.carried.task_ids
    assert list(statement.lease_ids) == one.carried.lease_ids + two.carried.lease_ids
    assert list(statement.runtimes) == [("a-*",), ("a-*",), None]
    outcomes = [ItemResult(i, "rt", s) for i, s in zip(statement.task_ids, "xyz", strict=True)]
    share([one, two], outcomes)
    assert one.carried.answer == ["x", "y"] and two.carried.answer == ["z"]


# -- where the completes go, against the database's line (gateway/admission.py) ----------


class LineStore:
    """A store that records each statement, with the priority it was sent at."""

    def __init__(self, crowded: bool) -> None:
        self.is_crowded = crowded
        self.sent: list[tuple[str, int, int, Priority]] = []

    def client_gone(self, claims: int) -> None:
        self.gone_claims = getattr(self, "gone_claims", 0) + claims

    def crowded(self) -> bool:
        return self.is_crowded

    def connection_free(self) -> bool:
        return True

    async def claim(self, runtime_id: str, workers: Any, leases: Any) -> Any:
        self.sent.append(("claim", len(workers), 0, priority.get()))
        return [], None

    async def claim_acked(self, runtime_id: str, workers: Any, leases: Any, completes: Any) -> Any:
        n = len(completes.task_ids)
        self.sent.append(("claim_acked", len(workers), n, priority.get()))
        return [], None, [ItemResult(i, runtime_id, "completed") for i in completes.task_ids]

    async def unclaim(self, task_ids: Any, lease_ids: Any) -> list[uuid.UUID]:
        self.sent.append(("unclaim", 0, len(task_ids), priority.get()))
        return list(task_ids)


def claimer(store: LineStore) -> Claimer:
    settings = Settings(cache_enabled=False)
    return Claimer(store, NoCache(), FakeWakeChannels("t"), settings, Metrics())  # type: ignore[arg-type]


async def claim_carrying(store: LineStore) -> Carried:
    carried = waiter([uuid.uuid4()]).carried
    assert carried is not None
    token = priority.set(Priority.WORK)  # as the claim's request runs
    try:
        await claimer(store).claim("rt", ClaimRequest("w", 1, 0.0, 60), None, carried)
    finally:
        priority.reset(token)
    return carried


async def test_completes_ride_in_the_claim_while_the_line_is_short() -> None:
    store = LineStore(crowded=False)
    carried = await claim_carrying(store)
    assert carried.answer == ["completed"]
    # One statement for both: as a release, since its completes free work.
    assert store.sent == [("claim_acked", 1, 1, Priority.RELEASE)]


async def test_a_claim_whose_line_is_full_is_not_lifted_past_it_by_its_completes() -> None:
    """The completes go in alone, as completes do; the claim then queues (or is shed)
    as a claim, at the priority of work."""
    store = LineStore(crowded=True)
    carried = await claim_carrying(store)
    assert carried.answer == ["completed"]
    assert store.sent == [("claim_acked", 0, 1, Priority.RELEASE), ("claim", 1, 0, Priority.WORK)]


async def test_leases_given_back_are_released_first_whoever_gives_them_back() -> None:
    store = LineStore(crowded=True)
    task = SimpleNamespace(id=uuid.uuid4(), lease_id=uuid.uuid4())
    token = priority.set(Priority.WORK)
    try:
        await claimer(store).give_back("rt", [task])  # type: ignore[list-item]
    finally:
        priority.reset(token)
    assert store.sent == [("unclaim", 0, 1, Priority.RELEASE)]
