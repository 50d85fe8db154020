"""The batch lease statements find their tasks by primary key, under custom and generic
plans, on the realistic table of tests/support/plans.py (filled once in a database of
its own; each test's transaction is rolled back): a batch never scans the task table.
They lock only the rows their item's lease holds (lease_sql._LEASE_HELD,
ack_sql._BATCH_HELD): the lease is tested below the lock, not after it. And no statement
that takes a list reads a list again for each of its items: under a generic plan, which
estimates every array at ten elements, a join of two lists became a nested loop, and
1,000 items took ten times as long as under a custom plan."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
import pytest

from gateway.store.sql import acks as ack_sql
from gateway.store.sql import leases as lease_sql
from tests.support.plans import (
    MODES,
    describe,
    indexes,
    plan_of,
    rescanned_lists,
    subtree,
    task_scans,
)

pytestmark = pytest.mark.integration


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


def holder_tested_before_lock(nodes: list[dict[str, Any]]) -> bool:
    """Whether every row `locked` locks comes from a row of `seen` (the snapshot) whose
    holding lease is its item's."""
    [node] = [n for n in nodes if n.get("Subplan Name") == "CTE locked"]
    [lock] = [n for n in subtree(node) if n["Node Type"] == "LockRows"]
    seen = [n for n in subtree(lock) if n.get("CTE Name") == "seen"]
    return len(seen) == 1 and "(seen_holder = item_lease)" in seen[0].get("Filter", "")


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
    conn: asyncpg.Connection,
    filled: str,
    mode: str,
    statement: str,
) -> None:
    # 200 of the table's 23,000 rows. A batch of 1,000 is 4% of this small table, where
    # the planner may rightly prefer one scan (it did, now and then); on a production
    # table a batch is a far smaller share, and the probes win by more.
    nodes = await plan_of(conn, mode, getattr(ack_sql, statement), batch_args(200, statement))
    shown = f"{statement} {mode}: {describe(nodes)}"
    assert not [n for n in task_scans(nodes) if n["Node Type"] == "Seq Scan"], shown
    assert indexes(nodes) == {"tasks_pkey"}, shown
    assert holder_tested_before_lock(nodes), shown
    assert [n.get("Index Name") for n in locked_scans(nodes, "locked")] == ["tasks_pkey"], shown


def group_args(n: int) -> list[tuple[Any, str]]:
    return [
        ([uuid.uuid4() for _ in range(n)], "uuid[]"),
        ([uuid.uuid4() for _ in range(n)], "uuid[]"),
        (['{"ok": 1}'] * n, "text[]"),
    ]


@pytest.mark.parametrize("mode", MODES)
async def test_grouped_completes_use_the_primary_key(
    conn: asyncpg.Connection,
    filled: str,
    mode: str,
) -> None:
    # COMPLETE_GROUP serves the single completes that arrive together (completions.py):
    # as many as GROUP_MAX tasks, each found by its id.
    nodes = await plan_of(conn, mode, lease_sql.COMPLETE_GROUP, group_args(200))
    shown = f"COMPLETE_GROUP {mode}: {describe(nodes)}"
    assert not [n for n in task_scans(nodes) if n["Node Type"] == "Seq Scan"], shown
    assert indexes(nodes) == {"tasks_pkey"}, shown
    assert lease_tested_before_lock(nodes), shown


def list_args(statement: str, runtime: str, n: int) -> list[tuple[Any, str]]:
    """`n` items for a statement that takes lists."""
    if statement == "COMPLETE_GROUP":
        return group_args(n)
    if statement == "UNCLAIM":
        return [([uuid.uuid4() for _ in range(n)], "uuid[]")] * 2
    if statement in ("CLAIM", "CLAIM_ACKED"):
        workers = [f"w{i}" for i in range(n)]
        claim = [(runtime, "text"), (workers, "text[]"), ([60.0] * n, "float8[]"), (n, "int")]
        return claim + (carried_args(n) if statement == "CLAIM_ACKED" else [])
    return batch_args(n, statement)


def carried_args(n: int) -> list[tuple[Any, str]]:
    """CLAIM_ACKED's $5 to $8: `n` completes, each with its caller's patterns."""
    return [
        ([uuid.uuid4() for _ in range(n)], "uuid[]"),
        ([uuid.uuid4() for _ in range(n)], "uuid[]"),
        (['{"ok": 1}'] * n, "text[]"),
        ([None if i % 2 else "explain-* other" for i in range(n)], "text[]"),
    ]


@pytest.mark.parametrize("mode", MODES)
async def test_a_claims_carried_completes_use_the_primary_key(
    conn: asyncpg.Connection,
    filled: str,
    mode: str,
) -> None:
    """CLAIM_ACKED finds each carried complete's task by its id and locks only those its
    lease holds, as BATCH_COMPLETE does; the claim beside it reads its own indexes
    (tests/integration/test_claim_explain.py holds its shape)."""
    args = list_args("CLAIM_ACKED", f"{filled}-hot", 200)
    nodes = await plan_of(conn, mode, lease_sql.CLAIM_ACKED, args)
    shown = f"CLAIM_ACKED {mode}: {describe(nodes)}"
    assert not [n for n in task_scans(nodes) if n["Node Type"] == "Seq Scan"], shown
    assert holder_tested_before_lock(nodes), shown
    assert [n.get("Index Name") for n in locked_scans(nodes, "locked")] == ["tasks_pkey"], shown
    [seen] = [n for n in nodes if n.get("Subplan Name") == "CTE seen"]
    assert indexes(subtree(seen)) == {"tasks_pkey"}, shown


LIST_STATEMENTS = [
    "BATCH_COMPLETE",
    "BATCH_FAIL",
    "BATCH_HEARTBEAT",
    "COMPLETE_GROUP",
    "UNCLAIM",
    "CLAIM",
    "CLAIM_ACKED",
]


def sql_of(statement: str) -> str:
    """A statement of LIST_STATEMENTS by name: the batch operations' (store/acks.py) or
    the lease statements' (store/leases.py)."""
    sql: str = getattr(ack_sql if statement.startswith("BATCH_") else lease_sql, statement)
    return sql


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("statement", LIST_STATEMENTS)
async def test_no_list_is_read_again_for_each_item(
    conn: asyncpg.Connection,
    filled: str,
    mode: str,
    statement: str,
) -> None:
    """Each list (the items, a CTE's rows) is read once, and each item's task is found
    by one probe: time linear in the items. A prepared statement runs its generic plan
    after five runs, and there a nested loop that read the items once per held row made
    a batch of 1,000 ten times slower than its custom plan (about 120 ms against 15)."""
    # The one list the check lets a subquery read per task: the token's patterns.
    assert "AS p(pattern)" in ack_sql.RUNTIME_COVERED
    for items in (1, 10, 200, 1000):
        args = list_args(statement, f"{filled}-hot", items)
        nodes = await plan_of(conn, mode, sql_of(statement), args)
        assert rescanned_lists(nodes) == [], f"{statement} {mode} {items}: {describe(nodes)}"


async def test_the_check_catches_a_join_of_two_lists(
    conn: asyncpg.Connection,
    filled: str,
) -> None:
    """Control: COMPLETE_GROUP with its update joined to the items again, as it was,
    reads the items once per held row under a generic plan, and the check sees it."""
    held = "FROM held h\n WHERE tasks.id = ANY (ARRAY[h.held_id])"
    assert held in lease_sql.COMPLETE_GROUP
    old = lease_sql.COMPLETE_GROUP.replace(
        held, "FROM items i JOIN held h ON h.held_id = i.item_id\n WHERE tasks.id = i.item_id"
    )
    nodes = await plan_of(conn, "force_generic_plan", old, group_args(200))
    assert rescanned_lists(nodes) == ["CTE Scan items"], describe(nodes)


@pytest.mark.parametrize("mode", MODES)
async def test_the_check_catches_a_list_read_by_a_subquery_per_row(
    conn: asyncpg.Connection,
    filled: str,
    mode: str,
) -> None:
    """Control: COMPLETE_GROUP taking each result by a subquery over the items, run for
    every task it completes, reads the items once per task under either plan, with no
    nested loop to show it; the check sees it."""
    result = "result = h.item_result::jsonb"
    assert result in lease_sql.COMPLETE_GROUP
    per_row = lease_sql.COMPLETE_GROUP.replace(
        result, "result = (SELECT i.item_result::jsonb FROM items i WHERE i.item_id = tasks.id)"
    )
    nodes = await plan_of(conn, mode, per_row, group_args(200))
    assert rescanned_lists(nodes) == ["CTE Scan items (per row)"], describe(nodes)
