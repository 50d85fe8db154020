"""Task ids start with their creation time (RFC 9562 version 7, migration 0009), on
every path that makes one: Postgres's default for tasks.id (single enqueue, a batch
without keys) and store.tasks.new_task_ids (a batch with keys, a task leased by sync
match).

Runs on the session's shared database, on runtime ids of its own, removed after.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime

import orjson
import pytest

from gateway.store import Store
from tests.support.databases import fetch
from tests.support.stores import enqueue_request

pytestmark = pytest.mark.integration

PAYLOAD = {"n": 1}


def millis_of(task_id: uuid.UUID) -> int:
    return int.from_bytes(task_id.bytes[:6], "big")


async def assert_time_ordered(database_url: str, ids: list[str]) -> None:
    """Each id is a version 7 UUID whose time is its row's created_at, to within the
    few milliseconds between the two clock readings of one INSERT."""
    rows = await fetch(
        database_url, "SELECT id, created_at FROM tasks WHERE id = ANY($1::uuid[])", ids
    )
    assert len(rows) == len(ids)
    for row in rows:
        task_id: uuid.UUID = uuid.UUID(str(row["id"]))
        assert task_id.version == 7 and task_id.variant == uuid.RFC_4122, task_id
        created: datetime = row["created_at"]
        assert abs(millis_of(task_id) - created.timestamp() * 1000) < 1000, (task_id, created)


async def test_a_single_enqueue_gets_a_time_ordered_id(
    store: Store,
    database_url: str,
    runtime_id: str,
) -> None:
    first, _ = await store.enqueue(runtime_id, enqueue_request(PAYLOAD))
    await asyncio.sleep(0.005)
    second, _ = await store.enqueue(runtime_id, enqueue_request(PAYLOAD))
    await assert_time_ordered(database_url, [str(first.id), str(second.id)])
    # Ids made milliseconds apart sort in the order they were made, as text and as uuid.
    assert str(first.id) < str(second.id)
    assert uuid.UUID(str(first.id)) < uuid.UUID(str(second.id))


async def test_a_task_leased_at_enqueue_gets_a_time_ordered_id(
    store: Store,
    database_url: str,
    runtime_id: str,
) -> None:
    # Sync match: the gateway chooses the id, so that it can name the lease's task.
    row, created = await store.enqueue(
        runtime_id, enqueue_request(PAYLOAD), lease=("worker-1", 30.0)
    )
    assert created and row.status == "claimed"
    await assert_time_ordered(database_url, [str(row.id)])


@pytest.mark.parametrize("keyed", [False, True], ids=["keyless", "with keys"])
async def test_a_batch_gets_time_ordered_ids(
    store: Store,
    database_url: str,
    runtime_id: str,
    keyed: bool,
) -> None:
    # Without keys Postgres's default makes the ids; with keys, the gateway does.
    reqs = [
        enqueue_request(PAYLOAD, idempotency_key=f"k{i}") if keyed else enqueue_request(PAYLOAD)
        for i in range(50)
    ]
    answer, _ = await store.enqueue_batch(runtime_id, reqs, ids_only=True)
    ids = [task["id"] for task in orjson.loads(answer)]
    assert len(set(ids)) == 50
    await assert_time_ordered(database_url, ids)


async def test_the_default_of_tasks_id_is_the_time_ordered_function(database_url: str) -> None:
    rows = await fetch(
        database_url,
        "SELECT column_default FROM information_schema.columns"
        " WHERE table_schema = current_schema() AND table_name = 'tasks'"
        " AND column_name = 'id'",
    )
    assert rows[0]["column_default"] == "time_ordered_uuid()"
    made = await fetch(
        database_url, "SELECT time_ordered_uuid() AS id FROM generate_series(1, 500)"
    )
    ids = [uuid.UUID(str(row["id"])) for row in made]
    assert len(set(ids)) == 500
    assert {task_id.version for task_id in ids} == {7}
    # 74 random bits: the digits after the time and version vary.
    for position in (15, 20, 35):
        assert len({str(task_id)[position] for task_id in ids}) > 8


async def test_the_time_of_an_id_is_the_unix_millisecond_it_was_made_in(database_url: str) -> None:
    """Rounded down, as RFC 9562 and new_task_ids have it: an id never carries a
    millisecond its clock had not reached. Read between two readings of the same clock,
    so that rounding to the nearest would show in about half of the rows."""
    made = await fetch(
        database_url,
        "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS before,"
        " time_ordered_uuid() AS id,"
        " floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS after"
        " FROM generate_series(1, 2000)",
    )
    for row in made:
        task_id = uuid.UUID(str(row["id"]))
        assert row["before"] <= millis_of(task_id) <= row["after"], (row, task_id)
