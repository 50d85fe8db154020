"""The batch lease statements find their tasks by primary key, under custom and generic
plans, on the realistic table of tests/integration/test_claim_explain.py (filled in a
transaction that is rolled back): a batch never scans the task table. And they lock
only the rows their item's lease holds (queries._LEASE_HELD): the lease is tested on
the scan below the lock, not after it."""

from __future__ import annotations

import json
import secrets
import uuid
from typing import Any

import asyncpg
import pytest

from gateway import queries as q
from tests.integration.conftest import conn  # noqa: F401  (a fixture)
from tests.integration.test_claim_explain import (  # noqa: F401  (filled is a fixture)
    MODES,
    describe,
    filled,
    indexes,
    subtree,
    task_scans,
    walk,
)

pytestmark = pytest.mark.integration


def literal(value: Any, sql_type: str) -> str:
    """A SQL array literal of the test's own values, or NULL, cast to `sql_type`."""
    if value is None:
        return f"NULL::{sql_type}"
    items = ", ".join("NULL" if v is None else f"'{v}'" for v in value)
    return f"ARRAY[{items}]::{sql_type}"


def locked_scans(nodes: list[dict[str, Any]], cte: str) -> list[dict[str, Any]]:
    """The task scans whose rows the CTE `cte` locks."""
    [node] = [n for n in nodes if n.get("Subplan Name") == f"CTE {cte}"]
    [lock] = [n for n in subtree(node) if n["Node Type"] == "LockRows"]
    return task_scans(subtree(lock))


def lease_tested_before_lock(nodes: list[dict[str, Any]]) -> bool:
    """Whether every row `held` locks passed the holding-lease test first."""
    scans = locked_scans(nodes, "held")
    conditions = ("Filter", "Index Cond", "Recheck Cond")
    return bool(scans) and all(
        "lease_id" in " ".join(str(n.get(c, "")) for c in conditions) for n in scans
    )


def batch_args(n: int, statement: str) -> list[tuple[Any, str]]:
    ids = [uuid.uuid4() for _ in range(n)]
    leases = [uuid.uuid4() for _ in range(n)]
    head = [(ids, "uuid[]"), (["explain-*"], "text[]"), (leases, "uuid[]")]
    tails: dict[str, list[tuple[Any, str]]] = {
        "BATCH_COMPLETE": [(['{"ok": 1}'] * n, "text[]")],
        "BATCH_FAIL": [
            (["boom"] * n, "text[]"),
            (["true"] * n, "bool[]"),
            ([None] * n, "float8[]"),
        ],
        "BATCH_HEARTBEAT": [(["60"] * n, "float8[]")],
    }
    return head + tails[statement]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("statement", ["BATCH_COMPLETE", "BATCH_FAIL", "BATCH_HEARTBEAT"])
async def test_batch_statements_use_the_primary_key(
    conn: asyncpg.Connection,  # noqa: F811
    filled: str,  # noqa: F811
    mode: str,
    statement: str,
) -> None:
    # 200 of the table's 23,000 rows. A batch of 1,000 is 4% of this small table, where
    # the planner may rightly prefer one scan (it did, now and then); on a production
    # table a batch is a far smaller share, and the probes win by more.
    args = batch_args(200, statement)
    name = "explain_" + secrets.token_hex(4)
    await conn.execute(f"SET LOCAL plan_cache_mode = {mode}")
    types = ", ".join(t for _, t in args)
    await conn.execute(f"PREPARE {name}({types}) AS {getattr(q, statement)}")
    try:
        values = ", ".join(literal(v, t) for v, t in args)
        raw = await conn.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE {name}({values})")
    finally:
        await conn.execute(f"DEALLOCATE {name}")
    nodes = list(walk((json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]))
    shown = f"{statement} {mode}: {describe(nodes)}"
    assert not [n for n in task_scans(nodes) if n["Node Type"] == "Seq Scan"], shown
    assert indexes(nodes) == {"tasks_pkey"}, shown
    assert lease_tested_before_lock(nodes), shown
    # The rows read again under a lock are those `held` left: ids an InitPlan computes
    # before the scan, so `held` has locked all its rows first.
    [node] = [n for n in nodes if n.get("Subplan Name") == "CTE moved"]
    assert [n for n in subtree(node) if n.get("Parent Relationship") == "InitPlan"], shown
    [moved] = locked_scans(nodes, "moved")
    assert "$" in moved.get("Index Cond", moved.get("Recheck Cond", "")), shown


@pytest.mark.parametrize("mode", MODES)
async def test_grouped_completes_use_the_primary_key(
    conn: asyncpg.Connection,  # noqa: F811
    filled: str,  # noqa: F811
    mode: str,
) -> None:
    # COMPLETE_GROUP serves the single completes that arrive together (completions.py):
    # as many as GROUP_MAX tasks, each found by its id.
    n = 200
    args = [
        ([uuid.uuid4() for _ in range(n)], "uuid[]"),
        ([uuid.uuid4() for _ in range(n)], "uuid[]"),
        (['{"ok": 1}'] * n, "text[]"),
    ]
    name = "explain_" + secrets.token_hex(4)
    await conn.execute(f"SET LOCAL plan_cache_mode = {mode}")
    await conn.execute(f"PREPARE {name}(uuid[], uuid[], text[]) AS {q.COMPLETE_GROUP}")
    try:
        values = ", ".join(literal(v, t) for v, t in args)
        raw = await conn.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE {name}({values})")
    finally:
        await conn.execute(f"DEALLOCATE {name}")
    nodes = list(walk((json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]))
    shown = f"COMPLETE_GROUP {mode}: {describe(nodes)}"
    assert not [n for n in task_scans(nodes) if n["Node Type"] == "Seq Scan"], shown
    assert indexes(nodes) == {"tasks_pkey"}, shown
    assert lease_tested_before_lock(nodes), shown
