"""How a claim pump gathers the completes its claims carry into one statement
(gateway/claim/pump.py): a claim whose completes name a task an earlier claim's do, or
would take the statement past CARRIED_MAX, waits for the next statement; each item goes
with its own claim's runtime patterns; and each claim gets back exactly its own items'
outcomes, in order."""

from __future__ import annotations

import uuid

from gateway.api.requests import ClaimRequest
from gateway.claim.pump import CARRIED_MAX, _fit, _merged, _share
from gateway.claim.waiters import Carried, Waiter
from gateway.rows import ItemResult


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
    taken, later = _fit([first, plain, again, other])
    assert taken == [first, plain, other] and later == [again]


def test_claims_past_the_bound_wait_but_the_first_always_goes() -> None:
    big = waiter([uuid.uuid4() for _ in range(CARRIED_MAX)])
    small = waiter([uuid.uuid4()])
    assert _fit([big, small]) == ([big], [small])
    alone = waiter([uuid.uuid4() for _ in range(CARRIED_MAX + 1)])
    assert _fit([alone]) == ([alone], [])
    fits = [waiter([uuid.uuid4() for _ in range(CARRIED_MAX // 2)]) for _ in range(2)]
    assert _fit(fits) == (fits, [])


def test_a_claim_whose_completes_are_applied_no_longer_counts() -> None:
    a = uuid.uuid4()
    done = waiter([a])
    assert done.carried is not None
    done.carried.answer = "applied"
    pending = waiter([a])
    assert _fit([done, pending]) == ([done, pending], [])


def test_each_item_carries_its_claims_patterns_and_each_claim_gets_its_own_outcomes() -> None:
    one, two = waiter([uuid.uuid4(), uuid.uuid4()], ("a-*",)), waiter([uuid.uuid4()])
    merged = _merged([one, two])
    assert one.carried is not None and two.carried is not None
    assert list(merged.task_ids) == one.carried.task_ids + two.carried.task_ids
    assert list(merged.lease_ids) == one.carried.lease_ids + two.carried.lease_ids
    assert list(merged.runtimes) == [("a-*",), ("a-*",), None]
    outcomes = [ItemResult(i, "rt", s) for i, s in zip(merged.task_ids, "xyz", strict=True)]
    _share([one, two], outcomes)
    assert one.carried.answer == ["x", "y"] and two.carried.answer == ["z"]
