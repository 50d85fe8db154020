"""gateway/claim/completions.py over an in-memory store: completes that arrive together share
a statement, a task named twice waits for the next one, a complete the statement did
not apply is answered by its own request, a failed statement fails its whole group, and
a request cancelled before its statement is not sent. Batch acknowledgements group the
same way, each getting its own items' outcomes, and only with the same runtime
patterns."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from gateway.claim import completions
from gateway.claim.completions import Completions
from gateway.errors import LeaseLost, StoreUnavailable
from gateway.metrics import Metrics
from gateway.rows import ItemResult, TaskRow

NOW = datetime.now(UTC)
TASK = TaskRow(
    id=uuid.uuid4(), runtime_id="rt", status="claimed", priority=50, payload=1, attempts=1,
    max_attempts=5, run_at=NOW, expires_at=None, created_at=NOW, updated_at=NOW,
    lease_id=None, lease_expires_at=None, worker_id="w", cancel_requested=False,
    result=None, last_error=None,
)  # fmt: skip


class Store:
    """Tasks held by leases; complete_group completes those whose lease matches, and
    waits for `gate` first when one is set."""

    def __init__(self) -> None:
        self.leases: dict[uuid.UUID, uuid.UUID] = {}
        self.done: dict[uuid.UUID, TaskRow] = {}
        self.groups: list[list[uuid.UUID]] = []
        self.ack_groups: list[tuple[list[uuid.UUID], tuple[str, ...] | None]] = []
        self.gate: asyncio.Event | None = None
        self.fail = False

    def hold(self) -> tuple[uuid.UUID, uuid.UUID]:
        task_id, lease_id = uuid.uuid4(), uuid.uuid4()
        self.leases[task_id] = lease_id
        return task_id, lease_id

    async def complete_group(
        self,
        task_ids: list[uuid.UUID],
        lease_ids: list[uuid.UUID],
        results: list[str | None],
    ) -> dict[uuid.UUID, TaskRow]:
        assert len(set(task_ids)) == len(task_ids), "a task named twice in one statement"
        self.groups.append(list(task_ids))
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise StoreUnavailable("down")
        out = {}
        for task_id, lease_id, result in zip(task_ids, lease_ids, results, strict=True):
            if task_id in self.done or self.leases.get(task_id) != lease_id:
                continue
            row = dataclasses.replace(
                TASK, id=task_id, lease_id=lease_id, status="completed", result=result
            )
            self.done[task_id] = out[task_id] = row
        return out

    async def complete_many(
        self,
        task_ids: list[uuid.UUID],
        lease_ids: list[uuid.UUID],
        results: list[str | None],
        runtimes: tuple[str, ...] | None,
    ) -> list[ItemResult]:
        assert len(set(task_ids)) == len(task_ids), "a task named twice in one statement"
        self.ack_groups.append((list(task_ids), runtimes))
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise StoreUnavailable("down")
        out = []
        for task_id, lease_id in zip(task_ids, lease_ids, strict=True):
            if task_id in self.done or self.leases.get(task_id) != lease_id:
                out.append(ItemResult(task_id, "rt", "claimed", LeaseLost("lost")))
                continue
            self.done[task_id] = dataclasses.replace(TASK, id=task_id, status="completed")
            out.append(ItemResult(task_id, "rt", "completed"))
        return out

    async def complete_missed(self, task_id: uuid.UUID, lease_id: uuid.UUID) -> TaskRow:
        row = self.done.get(task_id)
        if row is not None and row.lease_id == lease_id:
            return row
        raise LeaseLost("lost", task_status="claimed")


async def test_completes_that_arrive_together_share_one_statement() -> None:
    store = Store()
    metrics = Metrics()
    group = Completions(store, metrics)
    held = [store.hold() for _ in range(50)]
    rows = await asyncio.gather(*(group.complete(t, lease, f'"{t}"') for t, lease in held))
    assert [r.id for r in rows] == [t for t, _ in held]
    assert all(r.status == "completed" and r.result == f'"{r.id}"' for r in rows)
    assert store.groups == [[t for t, _ in held]]
    assert metrics.registry.get_sample_value("gateway_complete_statements_total") == 1


async def test_a_lone_complete_is_sent_at_once_and_groups_form_behind_busy_statements(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(completions, "GROUPS_IN_FLIGHT", 2)
    store = Store()
    store.gate = asyncio.Event()
    group = Completions(store, Metrics())
    held = [store.hold() for _ in range(7)]
    first = asyncio.create_task(group.complete(*held[0], None))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert store.groups == [[held[0][0]]]  # sent alone, without waiting for company
    second = asyncio.create_task(group.complete(*held[1], None))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert store.groups == [[held[0][0]], [held[1][0]]]
    rest = [asyncio.create_task(group.complete(t, lease, None)) for t, lease in held[2:]]
    await asyncio.sleep(0)
    assert len(store.groups) == 2  # both statements busy: the rest wait together
    store.gate.set()
    await asyncio.gather(first, second, *rest)
    assert store.groups[2:] == [[t for t, _ in held[2:]]]


async def test_a_task_named_twice_waits_for_the_next_statement_and_replays() -> None:
    store = Store()
    group = Completions(store, Metrics())
    task_id, lease_id = store.hold()
    other = store.hold()
    a, b, c = await asyncio.gather(
        group.complete(task_id, lease_id, '"first"'),
        group.complete(task_id, lease_id, '"second"'),
        group.complete(*other, None),
    )
    assert store.groups == [[task_id, other[0]], [task_id]]
    assert a == b  # the repeat is answered with the task as the first left it
    assert a.result == '"first"' and c.id == other[0]


async def test_a_complete_the_statement_did_not_apply_is_answered_alone() -> None:
    store = Store()
    group = Completions(store, Metrics())
    task_id, _ = store.hold()
    mine = store.hold()
    results = await asyncio.gather(
        group.complete(task_id, uuid.uuid4(), None),  # another lease
        group.complete(*mine, None),
        return_exceptions=True,
    )
    assert isinstance(results[0], LeaseLost)
    assert isinstance(results[1], TaskRow) and results[1].status == "completed"
    assert task_id not in store.done


async def test_a_failed_statement_fails_every_complete_of_its_group() -> None:
    store = Store()
    store.fail = True
    group = Completions(store, Metrics())
    held = [store.hold() for _ in range(3)]
    results = await asyncio.gather(
        *(group.complete(t, lease, None) for t, lease in held), return_exceptions=True
    )
    assert all(isinstance(r, StoreUnavailable) for r in results), results
    store.fail = False
    row = await group.complete(*held[0], None)  # the next statement runs as usual
    assert row.status == "completed"


async def test_a_request_cancelled_before_its_statement_is_not_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(completions, "GROUPS_IN_FLIGHT", 1)
    store = Store()
    store.gate = asyncio.Event()
    group = Completions(store, Metrics())
    busy, gone, kept = store.hold(), store.hold(), store.hold()
    first = asyncio.create_task(group.complete(*busy, None))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    cancelled = asyncio.create_task(group.complete(*gone, None))
    waiting = asyncio.create_task(group.complete(*kept, None))
    await asyncio.sleep(0)
    cancelled.cancel()
    store.gate.set()
    await asyncio.gather(first, waiting)
    assert cancelled.cancelled()
    assert store.groups == [[busy[0]], [kept[0]]]
    assert gone[0] not in store.done
    await group.close()


class GatedFirst(Store):
    """Holds each of the first `n` statements (completes or acknowledgements) until its
    own gate is set; later statements run at once."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n
        self.gates: list[asyncio.Future[None]] = []

    async def _wait_turn(self) -> None:
        if len(self.gates) < self.n:
            gate = asyncio.get_running_loop().create_future()
            self.gates.append(gate)
            await gate

    async def complete_group(self, *args: Any) -> dict[uuid.UUID, TaskRow]:
        await self._wait_turn()
        return await super().complete_group(*args)

    async def complete_many(self, *args: Any) -> list[ItemResult]:
        await self._wait_turn()
        return await super().complete_many(*args)


async def test_a_complete_arriving_as_every_sender_finishes_is_still_sent() -> None:
    # Every sender finds nothing waiting in the same loop turn; a complete arriving
    # right then must start a sender (a sender that counted itself out only in a done
    # callback, a turn later, left it waiting with nobody to send it).
    store = GatedFirst(completions.GROUPS_IN_FLIGHT)
    group = Completions(store, Metrics())
    firsts = []
    for _ in range(completions.GROUPS_IN_FLIGHT):
        firsts.append(asyncio.create_task(group.complete(*store.hold(), None)))
        for _ in range(3):
            await asyncio.sleep(0)
    assert len(store.gates) == completions.GROUPS_IN_FLIGHT
    last = store.hold()
    for gate in store.gates:
        gate.set_result(None)
    late = asyncio.create_task(group.complete(*last, None))
    await asyncio.gather(*firsts)
    row = await asyncio.wait_for(late, 5)
    assert row.id == last[0] and row.status == "completed"


async def test_an_acknowledgement_arriving_as_every_sender_finishes_is_still_sent() -> None:
    store = GatedFirst(completions.GROUPS_IN_FLIGHT)
    group = Completions(store, Metrics())
    firsts = []
    for _ in range(completions.GROUPS_IN_FLIGHT):
        firsts.append(asyncio.create_task(group.complete_many(*_ack(store, 1), [None], None)))
        for _ in range(3):
            await asyncio.sleep(0)
    assert len(store.gates) == completions.GROUPS_IN_FLIGHT
    ids, leases = _ack(store, 2)
    for gate in store.gates:
        gate.set_result(None)
    late = asyncio.create_task(group.complete_many(ids, leases, [None, None], None))
    await asyncio.gather(*firsts)
    outcomes = await asyncio.wait_for(late, 5)
    assert [(o.status, o.error) for o in outcomes] == [("completed", None)] * 2


async def test_many_completes_of_one_task_go_one_after_another() -> None:
    # A repeat waits for the complete before it, instead of going back into the queue
    # that every statement would walk again (time quadratic in the repeats).
    store = Store()
    group = Completions(store, Metrics())
    task_id, lease_id = store.hold()
    others = [store.hold() for _ in range(3)]
    rows = await asyncio.gather(
        *(group.complete(task_id, lease_id, f'"{i}"') for i in range(200)),
        *(group.complete(t, lease, None) for t, lease in others),
    )
    assert {r.result for r in rows[:200]} == {'"0"'}  # the first one's; the rest replay
    assert store.groups[0] == [task_id] + [t for t, _ in others]
    assert all(g == [task_id] for g in store.groups[1:]) and len(store.groups) == 200
    assert not group._latest  # nothing left behind


async def test_results_past_the_byte_bound_go_in_a_statement_of_their_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(completions, "GROUP_MAX_RESULT_BYTES", 100)
    store = Store()
    group = Completions(store, Metrics())
    held = [store.hold() for _ in range(4)]
    big = '"' + "x" * 98 + '"'  # 100 bytes: fills a statement alone
    await asyncio.gather(
        group.complete(*held[0], big),
        group.complete(*held[1], '"small"'),
        group.complete(*held[2], '"small"'),
        group.complete(*held[3], big),
    )
    assert store.groups == [[held[0][0]], [held[1][0], held[2][0]], [held[3][0]]]


def _ack(store: Store, n: int) -> tuple[list[uuid.UUID], list[uuid.UUID]]:
    held = [store.hold() for _ in range(n)]
    return [t for t, _ in held], [lease for _, lease in held]


async def test_acknowledgements_that_arrive_together_share_a_statement() -> None:
    store = Store()
    group = Completions(store, Metrics())
    first, second = _ack(store, 3), _ack(store, 2)
    second[1][0] = uuid.uuid4()  # its first task's lease is not the holder's
    a, b = await asyncio.gather(
        group.complete_many(first[0], first[1], [None] * 3, None),
        group.complete_many(second[0], second[1], [None] * 2, None),
    )
    assert store.ack_groups == [(first[0] + second[0], None)]
    assert [(r.task_id, r.status, r.error is None) for r in a] == [
        (t, "completed", True) for t in first[0]
    ]
    assert [r.task_id for r in b] == second[0]
    assert isinstance(b[0].error, LeaseLost) and b[1].status == "completed"


async def test_acknowledgements_group_only_with_the_same_patterns_and_other_tasks() -> None:
    store = Store()
    group = Completions(store, Metrics())
    mine, other, again = _ack(store, 2), _ack(store, 2), _ack(store, 1)
    overlap = ([mine[0][0]], [mine[1][0]])  # names a task of the first one
    await asyncio.gather(
        group.complete_many(mine[0], mine[1], [None] * 2, ["a-*"]),
        group.complete_many(other[0], other[1], [None] * 2, ["b-*"]),
        group.complete_many(overlap[0], overlap[1], [None], ["a-*"]),
        group.complete_many(again[0], again[1], [None], ["a-*"]),
        return_exceptions=True,
    )
    assert store.ack_groups == [
        (mine[0] + again[0], ("a-*",)),
        (other[0], ("b-*",)),
        (overlap[0], ("a-*",)),
    ]


async def test_a_large_acknowledgement_goes_alone_and_a_failure_fails_its_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(completions, "GROUP_MAX", 3)
    store = Store()
    group = Completions(store, Metrics())
    big, small = _ack(store, 5), _ack(store, 1)
    await asyncio.gather(
        group.complete_many(big[0], big[1], [None] * 5, None),
        group.complete_many(small[0], small[1], [None], None),
    )
    assert [ids for ids, _ in store.ack_groups] == [big[0], small[0]]
    store.fail = True
    one, two = _ack(store, 1), _ack(store, 1)
    results = await asyncio.gather(
        group.complete_many(one[0], one[1], [None], None),
        group.complete_many(two[0], two[1], [None], None),
        return_exceptions=True,
    )
    assert all(isinstance(r, StoreUnavailable) for r in results), results
    assert store.ack_groups[-1][0] == one[0] + two[0]
