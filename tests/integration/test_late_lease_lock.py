"""A lease operation never locks a task its lease does not hold (lease_sql._LEASE_HELD).

A claim skips locked rows (FOR UPDATE SKIP LOCKED) and, finding nothing, records the
runtime empty: a late complete (its lease lapsed, the janitor queued the task again)
or a made-up lease that locked the queued row would hide the task until the janitor's
repair (I6). Each test holds the lease operation's transaction open on one connection
while the gateway claims on another, so the interleaving is certain, not a race.

The statements' answers stay those of the single operations when another request
changes a task while the statement waits for it: those tests make the statement wait
on a transaction held open, and let it go by committing.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from gateway.rows import ItemResult
from gateway.store.leases import COMPLETE_REPLAYS, item_results
from gateway.store.sql import acks as ack_sql
from gateway.store.sql import janitor as janitor_sql
from gateway.store.sql import leases as lease_sql
from tests.support.databases import execute, waiting_for_a_lock
from tests.support.gateways import Instance, running_gateway
from tests.support.janitor import first_pass_done, janitor_settings, row_of

pytestmark = pytest.mark.integration


@pytest.fixture
async def gw(own_database_url: str, redis_url: str, redis_prefix: str) -> AsyncIterator[Instance]:
    async with running_gateway(janitor_settings(own_database_url, redis_url, redis_prefix)) as inst:
        await first_pass_done(inst)
        yield inst


@pytest.fixture
async def other(own_database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """The late request's own connection."""
    conn = await asyncpg.connect(own_database_url)
    try:
        yield conn
    finally:
        await conn.close()


async def requeued(gw: Instance, database_url: str, runtime_id: str) -> tuple[str, uuid.UUID]:
    """A task claimed, its lease lapsed and reclaimed by the janitor: queued again,
    with the claim's lease (now stale) returned alongside."""
    task = await gw.enqueue(runtime_id, {"job": "late"})
    [first] = await gw.claim(runtime_id, "late-worker", wait_seconds=0)
    await execute(
        database_url,
        "UPDATE tasks SET lease_expires_at = now() - interval '1 second' WHERE id = $1::uuid",
        task["id"],
    )
    assert (await gw.gateway.janitor.run_once()).reclaimed == 1
    assert (await row_of(database_url, task["id"]))["status"] == "queued"
    return task["id"], uuid.UUID(first["lease_id"])


async def never_claimed(gw: Instance, database_url: str, runtime_id: str) -> tuple[str, uuid.UUID]:
    """A queued task and a lease id made up by a client holding a claim token."""
    task = await gw.enqueue(runtime_id, {"job": "guessed"})
    return task["id"], uuid.uuid4()


SETUPS = {"lapsed and requeued": requeued, "made-up lease": never_claimed}

# Each batch statement's arguments after ($1 ids, $2 runtime patterns, $3 leases).
BATCH_TAILS: dict[str, list[Any]] = {
    "BATCH_COMPLETE": [['"late"']],
    "BATCH_FAIL": [["late"], [True], [None]],
    "BATCH_HEARTBEAT": [[60.0]],
}

# The single-row statements: (task id, lease id, their other arguments).
SINGLE_TAILS: dict[str, list[Any]] = {
    "COMPLETE": ['"late"'],
    "FAIL": ["late", True, None],
    "HEARTBEAT": [60.0],
    "RELEASE": [],
}


async def claim_meanwhile(gw: Instance, runtime_id: str, task_id: str) -> None:
    """The real claim, through the gateway, while the late statement's transaction is
    open: it must get the task at once."""
    got = await gw.claim(runtime_id, "new-worker", wait_seconds=0)
    assert [t["id"] for t in got] == [task_id], "the late statement hid the queued task"


@pytest.mark.parametrize("setup", sorted(SETUPS))
async def test_a_late_grouped_complete_leaves_the_requeued_task_to_a_claim(
    gw: Instance, own_database_url: str, other: asyncpg.Connection, runtime_id: str, setup: str
) -> None:
    task_id, stale = await SETUPS[setup](gw, own_database_url, runtime_id)
    async with other.transaction():
        done = await other.fetch(
            lease_sql.COMPLETE_GROUP, [uuid.UUID(task_id)], [stale], ['"late"']
        )
        assert done == []  # nothing completed; the request reads the task afresh
        await claim_meanwhile(gw, runtime_id, task_id)
    row = await row_of(own_database_url, task_id)
    assert row["status"] == "claimed" and row["worker_id"] == "new-worker"


@pytest.mark.parametrize("setup", sorted(SETUPS))
@pytest.mark.parametrize("statement", sorted(BATCH_TAILS))
async def test_a_late_batch_operation_leaves_the_requeued_task_to_a_claim(
    gw: Instance,
    own_database_url: str,
    other: asyncpg.Connection,
    runtime_id: str,
    setup: str,
    statement: str,
) -> None:
    task_id, stale = await SETUPS[setup](gw, own_database_url, runtime_id)
    args = [[uuid.UUID(task_id)], None, [stale], *BATCH_TAILS[statement]]
    async with other.transaction():
        rows = await other.fetch(getattr(ack_sql, statement), *args)
        [answer] = item_results(args[0], args[2], rows)
        # Still answered as the single operation would be: the lease lost the task.
        assert answer.error is not None and answer.error.code == "lease_lost", answer
        assert answer.status == "queued", answer
        await claim_meanwhile(gw, runtime_id, task_id)
    row = await row_of(own_database_url, task_id)
    assert row["status"] == "claimed" and row["worker_id"] == "new-worker"


@pytest.mark.parametrize("statement", sorted(SINGLE_TAILS))
async def test_a_late_single_operation_leaves_the_requeued_task_to_a_claim(
    gw: Instance, own_database_url: str, other: asyncpg.Connection, runtime_id: str, statement: str
) -> None:
    """The single-row statements (`UPDATE ... WHERE id AND lease_id AND status`) lock
    only the rows that pass their conditions: they never had the defect."""
    task_id, stale = await requeued(gw, own_database_url, runtime_id)
    async with other.transaction():
        sql = getattr(lease_sql, statement)
        assert await other.fetch(sql, uuid.UUID(task_id), stale, *SINGLE_TAILS[statement]) == []
        await claim_meanwhile(gw, runtime_id, task_id)


# -- answers when another request changes the task while the statement waits ----------


async def claimed_task(gw: Instance, runtime_id: str) -> tuple[uuid.UUID, uuid.UUID]:
    await gw.enqueue(runtime_id, {"job": 1})
    [task] = await gw.claim(runtime_id, "w", wait_seconds=0, lease_seconds=60)
    return uuid.UUID(task["id"]), uuid.UUID(task["lease_id"])


async def batch_after(
    first: asyncpg.Connection, database_url: str, change: tuple[Any, ...], batch: tuple[Any, ...]
) -> ItemResult:
    """Runs the batch statement `batch` (its name, then its arguments; one item) on a
    connection of its own while `first` holds a transaction that made the `change`
    (SQL, then arguments) to the item's task; commits `first` once the batch waits for
    the row, and returns the batch's answer."""
    second = await asyncpg.connect(database_url)
    try:
        async with first.transaction():
            await first.execute(*change)
            late = asyncio.create_task(second.fetch(getattr(ack_sql, batch[0]), *batch[1:]))
            await waiting_for_a_lock(first, second.get_server_pid())
        rows = await late
    finally:
        await second.close()
    replays = COMPLETE_REPLAYS if batch[0] == "BATCH_COMPLETE" else ()
    [answer] = item_results(batch[1], batch[3], rows, replay_statuses=replays)
    return answer


async def test_a_repeat_that_waited_for_the_first_complete_is_answered_as_it(
    gw: Instance, own_database_url: str, other: asyncpg.Connection, runtime_id: str
) -> None:
    """The repeat found the task held by its lease, then waited for the first complete:
    it answers completed, as a repeated complete does, and changes nothing."""
    task_id, lease = await claimed_task(gw, runtime_id)
    answer = await batch_after(
        other,
        own_database_url,
        (lease_sql.COMPLETE, task_id, lease, '"first"'),
        ("BATCH_COMPLETE", [task_id], None, [lease], ['"second"']),
    )
    assert (answer.error, answer.status) == (None, "completed"), answer
    assert (await row_of(own_database_url, str(task_id)))["result"] == '"first"'


async def test_a_complete_that_waited_for_its_own_heartbeat_completes(
    gw: Instance, own_database_url: str, other: asyncpg.Connection, runtime_id: str
) -> None:
    """The lease still holds the task once the heartbeat commits: the task is checked
    again on its newest version, and completed."""
    task_id, lease = await claimed_task(gw, runtime_id)
    answer = await batch_after(
        other,
        own_database_url,
        (lease_sql.HEARTBEAT, task_id, lease, 600.0),
        ("BATCH_COMPLETE", [task_id], None, [lease], ['"done"']),
    )
    assert (answer.error, answer.status) == (None, "completed"), answer
    assert (await row_of(own_database_url, str(task_id)))["result"] == '"done"'


@pytest.mark.parametrize("statement", sorted(BATCH_TAILS))
async def test_an_operation_that_waited_for_the_reclaim_is_lease_lost_queued(
    gw: Instance, own_database_url: str, other: asyncpg.Connection, runtime_id: str, statement: str
) -> None:
    """The lease held the task when the statement began; the janitor's reclaim, which
    the statement waited for, queued it again: lease_lost, naming the task's status
    after the reclaim, and the task is left as the reclaim left it."""
    task_id, lease = await claimed_task(gw, runtime_id)
    await execute(
        own_database_url,
        "UPDATE tasks SET lease_expires_at = now() - interval '1 second' WHERE id = $1",
        task_id,
    )
    answer = await batch_after(
        other,
        own_database_url,
        (janitor_sql.RECLAIM_LEASES, 100),
        (statement, [task_id], None, [lease], *BATCH_TAILS[statement]),
    )
    assert answer.error is not None and answer.error.code == "lease_lost", answer
    assert answer.status == "queued", answer
    row = await row_of(own_database_url, str(task_id))
    assert row["status"] == "queued" and row["lease_id"] is None


@pytest.mark.parametrize("statement", sorted(BATCH_TAILS))
async def test_an_item_whose_task_was_deleted_while_the_statement_waited_is_not_found(
    gw: Instance, own_database_url: str, other: asyncpg.Connection, runtime_id: str, statement: str
) -> None:
    """The lease held the task when the statement began, and the task was gone once
    the statement had its lock: the statement has no row for the item, which is not
    found, and the other items are answered as usual."""
    task_id, lease = await claimed_task(gw, runtime_id)
    kept_id, kept_lease = await claimed_task(gw, runtime_id)
    tails = [[*tail, *tail] for tail in BATCH_TAILS[statement]]
    first = await asyncpg.connect(own_database_url)
    try:
        second = await asyncpg.connect(own_database_url)
        try:
            async with first.transaction():
                await first.execute("DELETE FROM tasks WHERE id = $1", task_id)
                sql = getattr(ack_sql, statement)
                ids = [task_id, kept_id]
                late = asyncio.create_task(
                    second.fetch(sql, ids, None, [lease, kept_lease], *tails)
                )
                await waiting_for_a_lock(first, second.get_server_pid())
            rows = await late
        finally:
            await second.close()
    finally:
        await first.close()
    assert [r["item_id"] for r in rows] == [kept_id]
    gone, kept = item_results(ids, [lease, kept_lease], rows)
    assert gone.error is not None and gone.error.code == "not_found", gone
    assert kept.error is None and kept.status in ("completed", "queued", "claimed"), kept
