"""Statements an enqueue sends. A single enqueue is one statement; a batch without
idempotency keys is one statement too (nothing can conflict, so the statement alone is
all or nothing); a batch with keys runs in a transaction, so that an item refused for a
reused key undoes the items inserted with it.

Runs on the session's shared database, on runtime ids of its own, removed after.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import orjson
import pytest

from gateway.api.exactjson import ExactNumber
from gateway.api.render import task_bytes
from gateway.api.requests import EnqueueRequest
from gateway.errors import IdempotencyKeyReused
from gateway.rows import TaskRow
from gateway.store import Store
from gateway.store.sql import tasks as task_sql
from gateway.store.sql.fragments import TASK_COLUMNS
from tests.support.databases import fetch
from tests.support.stores import enqueue_request

pytestmark = pytest.mark.integration


async def statements_of(store: Store, runtime_id: str) -> list[str]:
    """What the store's connection sends from now on (after a first batch of each
    kind, on another runtime, has let the driver look up its types)."""
    seen: list[str] = []

    async def log_queries(conn: asyncpg.Connection) -> None:
        conn.add_query_logger(lambda record: seen.append(record.query))

    await store.enqueue_batch(runtime_id + "-warm-up", [enqueue_request(0)])
    await store.enqueue_batch(runtime_id + "-warm-up", [enqueue_request(0, delay_seconds=1)])
    await store.run(log_queries)
    return seen


async def test_single_and_keyless_batch_enqueues_are_one_statement(
    store: Store, runtime_id: str
) -> None:
    seen = await statements_of(store, runtime_id)
    await store.enqueue(runtime_id, enqueue_request("one"))
    assert seen == [task_sql.ENQUEUE]
    seen.clear()
    rows, replayed = await store.enqueue_batch(
        runtime_id,
        [enqueue_request(1), enqueue_request(2, delay_seconds=60), enqueue_request(3, priority=90)],
    )
    assert seen == [task_sql.ENQUEUE_BATCH_NEW]
    tasks = orjson.loads(rows)
    assert [t["priority"] for t in tasks] == [50, 50, 90], "not in request order"
    assert [t["status"] for t in tasks] == ["queued"] * 3 and replayed is False
    stored = await store.run(
        lambda c: c.fetch(
            "SELECT status FROM tasks WHERE runtime_id = $1 ORDER BY created_at", runtime_id
        )
    )
    assert [r["status"] for r in stored] == ["queued", "queued", "scheduled", "queued"]
    # Items that set no time (the usual batch) take the plain statement.
    seen.clear()
    rows, _ = await store.enqueue_batch(
        runtime_id, [enqueue_request(4), enqueue_request(5, max_attempts=2)]
    )
    assert seen == [task_sql.ENQUEUE_BATCH_PLAIN]
    assert [t["payload"] for t in orjson.loads(rows)] == [4, 5]


async def test_a_batch_with_keys_is_all_or_nothing(
    store: Store, runtime_id: str, database_url: str
) -> None:
    seen = await statements_of(store, runtime_id)
    await store.enqueue_batch(runtime_id, [enqueue_request(1, idempotency_key="k1")])
    assert seen[0].startswith("BEGIN; SET LOCAL statement_timeout") and seen[-1] == "COMMIT"
    with pytest.raises(IdempotencyKeyReused):
        await store.enqueue_batch(
            runtime_id,
            [
                enqueue_request("new"),
                enqueue_request("other", idempotency_key="k1"),
                enqueue_request("last"),
            ],
        )
    rows = await fetch(database_url, "SELECT payload FROM tasks WHERE runtime_id = $1", runtime_id)
    assert len(rows) == 1, "a refused batch left rows behind"


# Payloads whose jsonb text differs from what was sent: keys reordered and repeated,
# spacing, numbers Postgres writes its own way, escapes, text beyond ASCII.
ODD_PAYLOADS: list[Any] = [
    {"bb": 1, "a": {"z": [], "y": {}}, "bb ": "x"},
    'line\nbreak\ttab "quoted" \\ back\u2028sep\u0001',
    "é 字 😀",
    ExactNumber("1E+2"),
    ExactNumber("-0.000"),
    ExactNumber("12345678901234567890123456789"),
    [1.5, -0.0, 1e-7, True, None, [[[]]]],
    "",
]


async def test_a_plain_batchs_json_written_by_the_gateway_is_the_one_models_writes(
    store: Store, runtime_id: str
) -> None:
    # store.tasks.plain_tasks_json writes the answer to a batch of items that set no
    # time from Postgres's ids and payload texts: byte for byte what models.task_bytes
    # makes of each stored row, read back.
    items = [enqueue_request(p) for p in ODD_PAYLOADS] + [
        enqueue_request(None, priority=1000, max_attempts=100)
    ]
    written, replayed = await store.enqueue_batch(runtime_id, items)
    assert replayed is False
    stored = await store.run(
        lambda c: c.fetch(
            f"SELECT {TASK_COLUMNS} FROM tasks WHERE runtime_id = $1 ORDER BY created_at",
            runtime_id,
        )
    )
    expected = [task_bytes(TaskRow.of(row)).decode() for row in stored]
    assert written == "[" + ",".join(expected) + "]"


PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize("keyed", [False, True], ids=["without-keys", "with-keys"])
async def test_a_new_tasks_json_from_postgres_is_the_one_models_writes(
    store: Store, runtime_id: str, keyed: bool
) -> None:
    # task_sql.NEW_TASK_JSON writes a batch's new tasks in SQL: byte for byte what
    # models.task_bytes makes of the stored row, for every field a new task can carry,
    # through either batch statement (ENQUEUE_BATCH_NEW without keys, ENQUEUE_BATCH).
    items = [
        enqueue_request({"b": [1, 2.5, 'é\u0001"x'], "a": None}),
        enqueue_request(None, priority=0, max_attempts=1),
        enqueue_request("text", delay_seconds=3600, ttl_seconds=60),
        enqueue_request(
            ExactNumber("1234567890123456789.5e-2"), run_at="2031-02-03T04:05:06.000007+02:00"
        ),
        enqueue_request(0.1, ttl_seconds=1.5),
        enqueue_request([], run_at="1970-01-01T00:00:00Z", ttl_seconds=86400),
        enqueue_request(7)._replace(trace_parent=PARENT),
        enqueue_request(8)._replace(trace_parent=PARENT, trace_state='k=v,"q"=\\x'),
    ]
    if keyed:
        items = [r._replace(idempotency_key=f"k{n}") for n, r in enumerate(items)]
    written, _ = await store.enqueue_batch(runtime_id, items)
    stored = await store.run(
        lambda c: c.fetch(
            f"SELECT {TASK_COLUMNS} FROM tasks WHERE runtime_id = $1 ORDER BY created_at",
            runtime_id,
        )
    )
    assert len(stored) == len(items)
    expected = [task_bytes(TaskRow.of(row)).decode() for row in stored]
    assert written == "[" + ",".join(expected) + "]"
    assert orjson.loads(written)[5]["status"] == "expired"  # its ttl ran out in 1970


@pytest.mark.parametrize(
    ("items", "statement"),
    [
        ([enqueue_request(1), enqueue_request(2, priority=90)], "ENQUEUE_BATCH_PLAIN_IDS"),
        ([enqueue_request(1), enqueue_request(2, delay_seconds=60)], "ENQUEUE_BATCH_NEW_IDS"),
        ([enqueue_request(1), enqueue_request(2, idempotency_key="k")], "ENQUEUE_BATCH_IDS"),
    ],
    ids=["plain", "timed", "keyed"],
)
async def test_a_batch_asked_for_ids_only_gets_no_payload_back(
    store: Store, runtime_id: str, items: list[EnqueueRequest], statement: str
) -> None:
    # `Prefer: return=minimal`: each kind of batch goes through its statement's *_IDS
    # twin, which answers `{"id":...}` per task and sends no payload text back.
    seen = await statements_of(store, runtime_id)
    written, replayed = await store.enqueue_batch(runtime_id, items, ids_only=True)
    assert getattr(task_sql, statement) in seen, seen
    assert not {
        task_sql.ENQUEUE_BATCH,
        task_sql.ENQUEUE_BATCH_NEW,
        task_sql.ENQUEUE_BATCH_PLAIN,
    } & set(seen)
    assert "payload" not in getattr(task_sql, statement).split("RETURNING")[-1]
    stored = await store.run(
        lambda c: c.fetch(
            "SELECT id FROM tasks WHERE runtime_id = $1 ORDER BY created_at", runtime_id
        )
    )
    assert written == "[" + ",".join(f'{{"id":"{r["id"]}"}}' for r in stored) + "]"
    assert replayed is False


def sent_back(sql: str) -> str:
    """What a statement sends back: the list after its last RETURNING, or a SELECT's
    select list."""
    if "RETURNING" in sql:
        return sql.rsplit("RETURNING", 1)[1]
    if "SELECT" in sql:
        return sql.split("SELECT", 1)[1].split("FROM", 1)[0]
    return ""


async def test_a_batch_asked_for_ids_only_reads_no_payload_of_a_replayed_item(
    store: Store, runtime_id: str
) -> None:
    # A producer retrying a batch whose answer it lost replays every item: with
    # `Prefer: return=minimal` the stored tasks' payloads must not come back either.
    big = {"blob": "x" * 10_000}
    made, _ = await store.enqueue_batch(runtime_id, [enqueue_request(big, idempotency_key="k")])
    [old_id] = [t["id"] for t in orjson.loads(made)]
    seen = await statements_of(store, runtime_id)
    mixed = [
        enqueue_request(1),
        enqueue_request(big, idempotency_key="k"),
        enqueue_request(2, idempotency_key="new"),
    ]
    written, replayed = await store.enqueue_batch(runtime_id, mixed, ids_only=True)
    again, all_replayed = await store.enqueue_batch(
        runtime_id, [enqueue_request(big, idempotency_key="k")], ids_only=True
    )
    assert seen and not [s for s in seen if "payload" in sent_back(s)], seen
    ids = [t["id"] for t in orjson.loads(written)]
    assert ids[1] == old_id and len(set(ids)) == 3 and replayed is False
    assert orjson.loads(again) == [{"id": old_id}] and all_replayed is True
    # A different request under the key is refused as it is without ids_only.
    with pytest.raises(IdempotencyKeyReused) as info:
        await store.enqueue_batch(
            runtime_id, [enqueue_request(3, idempotency_key="k")], ids_only=True
        )
    assert info.value.extra["field"] == "tasks[0].idempotency_key"
    stored = await store.run(
        lambda c: c.fetch(
            "SELECT id, payload FROM tasks WHERE runtime_id = $1 ORDER BY created_at", runtime_id
        )
    )
    assert [str(r["id"]) for r in stored] == [old_id, ids[0], ids[2]]
