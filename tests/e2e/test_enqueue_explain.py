"""The batch enqueue statements, under custom and generic plans, on the realistic table
of tests/support/plans.py (filled once in a database of its own; each test's
transaction is rolled back): an insert
reads no task row and no list twice, a batch with keys settles its conflicts on the
idempotency index, and the replays of a batch are found through that index, never by a
scan of the table."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
import pytest

from gateway.store.sql import tasks as task_sql
from tests.support.plans import MODES, describe, indexes, plan_of, rescanned_lists, task_scans

pytestmark = pytest.mark.integration

# The item columns each statement takes after the runtime ($1), as the store sends them
# for items that set every field (store/tasks.py): the integer columns and the payloads
# as one text each, the rest as arrays.
TIMED = [("timestamptz[]", None), ("float8[]", 5.0), ("float8[]", 60.0)]
PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def enqueue_args(statement: str, runtime: str, n: int) -> list[tuple[Any, str]]:
    ints = "{" + ",".join(["50"] * n) + "}"
    payloads = "[" + ",".join(f'{{"i":{i}}}' for i in range(n)) + "]"
    timed = [([value] * n, sql_type) for sql_type, value in TIMED]
    items = [(ints, "text"), (payloads, "text"), (ints, "text")]  # priority, payload, max
    if statement.startswith("ENQUEUE_BATCH_PLAIN"):
        return [(runtime, "text"), *items]
    # Every item traced: the trace columns as the store sends them when one item sets them.
    traces = [([PARENT] * n, "text[]"), (["k=v"] * n, "text[]")]
    if statement.startswith("ENQUEUE_BATCH_NEW"):
        return [(runtime, "text"), *items, *timed, *traces]
    ids = [uuid.uuid4() for _ in range(n)]
    keys = [f"key-{i}" for i in range(n)]
    return [
        (runtime, "text"),
        (ids, "uuid[]"),
        *items,
        *timed,
        (keys, "text[]"),
        (["h"] * n, "text[]"),
        *traces,
    ]


INSERTS = [
    "ENQUEUE_BATCH",
    "ENQUEUE_BATCH_IDS",
    "ENQUEUE_BATCH_NEW",
    "ENQUEUE_BATCH_NEW_IDS",
    "ENQUEUE_BATCH_PLAIN",
    "ENQUEUE_BATCH_PLAIN_IDS",
]


# Each test goes through its statements in turn: filling the table is most of its time.
@pytest.mark.parametrize("mode", MODES)
async def test_a_batch_insert_reads_no_task_and_each_list_once(
    conn: asyncpg.Connection,
    filled: str,
    mode: str,
) -> None:
    for statement, items in ((s, n) for s in INSERTS for n in (1, 10, 1000)):
        args = enqueue_args(statement, f"{filled}-hot", items)
        nodes = await plan_of(conn, mode, getattr(task_sql, statement), args)
        shown = f"{statement} {mode} {items}: {describe(nodes)}"
        assert task_scans(nodes) == [], shown
        assert rescanned_lists(nodes) == [], shown
        # The items are read by their one ROWS FROM (`i`): a second read of them, even
        # hashed or merged rather than rescanned, is a list read twice.
        reads = [n.get("Alias") for n in nodes if n["Node Type"] == "Function Scan"]
        assert reads == ["i"], shown
        [insert] = [n for n in nodes if n["Node Type"] == "ModifyTable"]
        # Only a batch with keys can conflict, and it settles on the idempotency index.
        keyed = statement in ("ENQUEUE_BATCH", "ENQUEUE_BATCH_IDS")
        arbiters = ["tasks_idempotency_idx"] if keyed else []
        assert insert.get("Conflict Arbiter Indexes", []) == arbiters, shown


@pytest.mark.parametrize("mode", MODES)
async def test_a_batch_finds_its_replays_by_the_idempotency_index(
    conn: asyncpg.Connection,
    filled: str,
    mode: str,
) -> None:
    lookups = ["GET_BY_IDEMPOTENCY_KEYS", "GET_REFS_BY_IDEMPOTENCY_KEYS"]
    for statement, items in ((s, n) for s in lookups for n in (1, 200, 1000)):
        args = [(f"{filled}-hot", "text"), ([f"key-{i}" for i in range(items)], "text[]")]
        nodes = await plan_of(conn, mode, getattr(task_sql, statement), args)
        shown = f"{statement} {mode} {items}: {describe(nodes)}"
        assert not [n for n in task_scans(nodes) if n["Node Type"] == "Seq Scan"], shown
        assert indexes(nodes) == {"tasks_idempotency_idx"}, shown
