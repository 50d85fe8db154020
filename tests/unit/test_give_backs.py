"""Give-backs (gateway/claim/give_backs.py): leases that never reached their poll go back
in shared statements, one at a time, and each statement's runtimes are bumped in one
call after its commit; a caller that is cancelled does not stop its give-back, and a
failed statement is logged, not raised."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.claim import give_backs
from gateway.claim.give_backs import GiveBacks
from gateway.errors import StoreUnavailable


def task(lease: bool = True) -> Any:
    return SimpleNamespace(id=uuid.uuid4(), lease_id=uuid.uuid4() if lease else None)


class Recorder:
    """unclaim and announce_many as the Claimer passes them: each statement's tasks and
    leases, each announcement's runtimes, in order. A statement waits for `gate`."""

    def __init__(self) -> None:
        self.statements: list[tuple[list[uuid.UUID], list[uuid.UUID]]] = []
        self.announced: list[list[str]] = []
        self.events: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail: Exception | None = None

    async def unclaim(self, task_ids: Sequence[uuid.UUID], lease_ids: Sequence[uuid.UUID]) -> Any:
        self.events.append(f"unclaim {len(task_ids)}")
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        self.statements.append((list(task_ids), list(lease_ids)))
        return list(task_ids)

    async def announce_many(self, runtime_ids: Sequence[str]) -> None:
        self.events.append("announce")
        self.announced.append(list(runtime_ids))


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def test_give_backs_that_arrive_during_a_statement_share_the_next() -> None:
    rec = Recorder()
    backs = GiveBacks(rec.unclaim, rec.announce_many)
    rec.gate.clear()
    first = [task()]
    alone = asyncio.create_task(backs.give_back("rt-0", first))
    await settle()
    assert rec.events == ["unclaim 1"], "a give-back alone is sent at once"
    later = [[task(), task()] for _ in range(30)]
    waiting = [
        asyncio.create_task(backs.give_back(f"rt-{k % 3}", tasks)) for k, tasks in enumerate(later)
    ]
    await settle()
    assert rec.events == ["unclaim 1"], "one statement at a time"
    rec.gate.set()
    await asyncio.wait_for(asyncio.gather(alone, *waiting), 5)
    assert len(rec.statements) == 2, "the 30 that waited went in one statement"
    ids, leases = rec.statements[1]
    assert ids == [t.id for tasks in later for t in tasks]
    assert leases == [t.lease_id for tasks in later for t in tasks]
    # Each statement's runtimes bumped once, after its commit.
    assert rec.announced == [["rt-0"], ["rt-0", "rt-1", "rt-2"]]
    assert rec.events == ["unclaim 1", "announce", "unclaim 60", "announce"]


async def test_a_statement_carries_at_most_group_max_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(give_backs, "GROUP_MAX", 4)
    rec = Recorder()
    backs = GiveBacks(rec.unclaim, rec.announce_many)
    rec.gate.clear()
    held = asyncio.create_task(backs.give_back("rt", [task()]))
    await settle()
    big = [task() for _ in range(6)]  # larger than a group: goes alone, whole
    small = [[task(), task()] for _ in range(3)]
    waiting = [asyncio.create_task(backs.give_back("rt", big))]
    waiting += [asyncio.create_task(backs.give_back("rt", s)) for s in small]
    await settle()
    rec.gate.set()
    await asyncio.wait_for(asyncio.gather(held, *waiting), 5)
    sizes = [len(ids) for ids, _ in rec.statements]
    assert sizes == [1, 6, 4, 2]


async def test_a_cancelled_caller_still_has_its_tasks_given_back() -> None:
    rec = Recorder()
    backs = GiveBacks(rec.unclaim, rec.announce_many)
    rec.gate.clear()
    first = asyncio.create_task(backs.give_back("rt", [task()]))
    await settle()
    mine = [task()]
    caller = asyncio.create_task(backs.give_back("rt", mine))
    await settle()
    caller.cancel()
    await settle()
    rec.gate.set()
    await asyncio.wait_for(first, 5)
    for _ in range(50):
        if len(rec.statements) == 2:
            break
        await asyncio.sleep(0.01)
    assert [ids for ids, _ in rec.statements][1] == [mine[0].id]


async def test_a_failed_statement_is_logged_and_announces_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rec = Recorder()
    rec.fail = StoreUnavailable("the database is gone")
    backs = GiveBacks(rec.unclaim, rec.announce_many)
    with caplog.at_level(logging.WARNING, logger="gateway.claim"):
        await asyncio.wait_for(backs.give_back("rt", [task(), task()]), 5)
    assert rec.announced == []
    assert "could not give back 2 undelivered leases" in caplog.text
    # The next give-back is sent again, by a new sender.
    rec.fail = None
    await asyncio.wait_for(backs.give_back("rt", [task()]), 5)
    assert len(rec.statements) == 1 and rec.announced == [["rt"]]


async def test_tasks_without_a_lease_send_nothing() -> None:
    rec = Recorder()
    backs = GiveBacks(rec.unclaim, rec.announce_many)
    await backs.give_back("rt", [task(lease=False)])
    assert rec.events == []
