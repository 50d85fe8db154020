"""The hot-path statements keep their indexes: CLAIM walks tasks_claim_idx, NEXT_DUE
walks tasks_due_idx, and neither scans the whole task table.

The data is realistic and the planner chooses on its own (no enable_seqscan): 20,000
rows over 200 runtimes, nearly all finished, a few queued per runtime (some delayed),
plus one "hot" runtime with a backlog of 3,000 queued tasks.
Everything happens in one transaction that is rolled back, so the session's shared
database is left as it was.
"""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest

from gateway import queries as q

pytestmark = pytest.mark.integration

RUNTIMES = 200
ROWS = 20_000
BACKLOG = 3_000

# Row n belongs to runtime n % 200. Per runtime: 100 rows, of which 5 queued and due,
# 2 queued with a run_at in the future, 3 claimed, the rest completed / dead / cancelled.
FILL = """
INSERT INTO tasks (runtime_id, status, priority, payload, attempts, run_at, created_at,
                   updated_at, finished_at, lease_id, lease_expires_at, worker_id)
SELECT $1 || '-' || (n % $2),
       s.status,
       (n * 7) % 101,
       jsonb_build_object('n', n),
       CASE WHEN s.status = 'queued' THEN 0 ELSE 1 END,
       CASE WHEN (n / $2) % 100 IN (5, 6) THEN now() + interval '1 hour'
            ELSE now() - interval '1 minute' END,
       now() - make_interval(secs => $3 - n),
       now() - make_interval(secs => $3 - n),
       CASE WHEN s.status IN ('completed', 'dead', 'cancelled') THEN now() END,
       CASE WHEN s.status = 'claimed' THEN gen_random_uuid() END,
       CASE WHEN s.status = 'claimed' THEN now() + interval '1 minute' END,
       CASE WHEN s.status = 'claimed' THEN 'worker' END
  FROM generate_series(0, $3 - 1) AS n,
       LATERAL (SELECT CASE
                  WHEN (n / $2) % 100 < 7 THEN 'queued'
                  WHEN (n / $2) % 100 < 10 THEN 'claimed'
                  WHEN (n / $2) % 100 < 12 THEN 'dead'
                  WHEN (n / $2) % 100 < 13 THEN 'cancelled'
                  ELSE 'completed' END AS status) AS s
"""


# A runtime with a backlog: queued tasks of mixed priority, a few of them delayed.
HOT = """
INSERT INTO tasks (runtime_id, priority, payload, run_at, created_at)
SELECT $1, n % 3 * 50, jsonb_build_object('n', n),
       CASE WHEN n % 50 = 0 THEN now() + interval '10 minutes' ELSE now() END,
       now() - make_interval(secs => $2 - n)
  FROM generate_series(0, $2 - 1) AS n
"""


@pytest.fixture
async def filled(conn: asyncpg.Connection) -> AsyncIterator[str]:
    """Fills the table inside a transaction that is rolled back afterwards; yields the
    runtime id prefix."""
    prefix = "explain-" + secrets.token_hex(4)
    tx = conn.transaction()
    await tx.start()
    try:
        await conn.execute(FILL, prefix, RUNTIMES, ROWS)
        await conn.execute(HOT, prefix + "-hot", BACKLOG)
        await conn.execute("ANALYZE tasks")
        yield prefix
    finally:
        await tx.rollback()


def walk(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from walk(child)


def literal(value: Any) -> str:
    """A SQL literal for the test's own (quote-free) values."""
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "ARRAY[" + ", ".join(literal(v) for v in value) + "]::text[]"
    if isinstance(value, list):
        return "ARRAY[" + ", ".join(repr(float(v)) for v in value) + "]::float8[]"
    raise TypeError(value)


async def explain(
    conn: asyncpg.Connection, sql: str, types: str, args: tuple[Any, ...], mode: str
) -> list[dict[str, Any]]:
    """EXPLAIN the statement as a prepared statement runs it, under `plan_cache_mode`
    `mode`: custom plans (the first five executions) or the generic plan Postgres may
    switch to afterwards (asyncpg prepares and caches every statement)."""
    name = "explain_" + secrets.token_hex(4)
    await conn.execute(f"SET LOCAL plan_cache_mode = {mode}")
    await conn.execute(f"PREPARE {name}({types}) AS {sql}")
    try:
        # EXECUTE takes no bind parameters: the values go in as literals.
        values = ", ".join(literal(arg) for arg in args)
        raw = await conn.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE {name}({values})")
    finally:
        await conn.execute(f"DEALLOCATE {name}")
    document = json.loads(raw) if isinstance(raw, str) else raw
    return list(walk(document[0]["Plan"]))


def describe(nodes: list[dict[str, Any]]) -> list[str]:
    return [
        " ".join(str(n[k]) for k in ("Node Type", "Relation Name", "Index Name", "Alias") if k in n)
        for n in nodes
    ]


def task_scans(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [n for n in nodes if n.get("Relation Name") == "tasks" and "Scan" in n["Node Type"]]


def claim_args(runtime: str) -> tuple[Any, ...]:
    workers = [f"w{i}" for i in range(5)]
    return (runtime, workers, [60.0, 60.0, 30.0, 120.0, 60.0])


def subtree(node: dict[str, Any]) -> list[dict[str, Any]]:
    return list(walk(node))


MODES = ["force_custom_plan", "force_generic_plan"]


async def test_the_data_is_what_the_plans_are_judged_on(
    conn: asyncpg.Connection, filled: str
) -> None:
    counts = dict(
        await conn.fetch(
            "SELECT status, count(*) FROM tasks WHERE runtime_id LIKE $1 GROUP BY status",
            filled + "-%",
        )
    )
    assert sum(counts.values()) == ROWS + BACKLOG
    assert counts["queued"] == RUNTIMES * 7 + BACKLOG
    assert counts["completed"] > ROWS * 0.8
    runtimes = await conn.fetchval(
        "SELECT count(DISTINCT runtime_id) FROM tasks WHERE runtime_id LIKE $1", filled + "-%"
    )
    assert runtimes == RUNTIMES + 1
    # The statements under test work on this data (the claim is undone by a savepoint).
    savepoint = conn.transaction()
    await savepoint.start()
    try:
        rows = await conn.fetch(q.CLAIM, *claim_args(f"{filled}-17"))
        assert sorted(r["slot"] for r in rows) == [1, 2, 3, 4, 5]
        assert {r["runtime_id"] for r in rows} == {f"{filled}-17"}
    finally:
        await savepoint.rollback()
    assert await conn.fetchval(q.NEXT_DUE, f"{filled}-17") is not None
    hot = await conn.fetchval(
        "SELECT count(*) FROM tasks WHERE runtime_id = $1 AND status = 'queued'", filled + "-hot"
    )
    assert hot == BACKLOG


def indexes(nodes: list[dict[str, Any]]) -> set[str]:
    return {n["Index Name"] for n in nodes if "Index Name" in n}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("which", ["17", "hot"])
async def test_claim_uses_the_claim_index(
    conn: asyncpg.Connection, filled: str, mode: str, which: str
) -> None:
    """On a quiet runtime and on one with a backlog, under custom and generic plans."""
    runtime = f"{filled}-{which}"
    # EXPLAIN without ANALYZE does not run the UPDATE; the fixture's transaction is
    # rolled back in any case.
    nodes = await explain(conn, q.CLAIM, "text, text[], float8[]", claim_args(runtime), mode)
    shown = f"{mode}, {which}: {describe(nodes)}"
    assert not [n for n in task_scans(nodes) if n["Node Type"] == "Seq Scan"], shown
    assert indexes(nodes) <= {"tasks_claim_idx", "tasks_pkey"}, shown
    # The candidates come from an ordered scan of the claim index, seeking on the
    # runtime, under the LIMIT and the row locks, with no sort in between: the scan
    # stops after LIMIT rows however long the runtime's backlog is.
    [scan] = [n for n in nodes if n.get("Index Name") == "tasks_claim_idx"] or [None]
    assert scan is not None, f"CLAIM does not use tasks_claim_idx: {shown}"
    assert scan["Node Type"] == "Index Scan", shown
    assert "runtime_id" in scan.get("Index Cond", ""), shown
    limits = [n for n in nodes if n["Node Type"] == "Limit" and scan in subtree(n)]
    assert limits, shown
    between = subtree(limits[0])
    assert [n["Node Type"] for n in between] == ["Limit", "LockRows", "Index Scan"], shown
    # The rows to update are found again by primary key.
    assert "tasks_pkey" in indexes(nodes), shown


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("which", ["17", "hot"])
async def test_next_due_uses_the_due_index(
    conn: asyncpg.Connection, filled: str, mode: str, which: str
) -> None:
    nodes = await explain(conn, q.NEXT_DUE, "text", (f"{filled}-{which}",), mode)
    shown = f"{mode}, {which}: {describe(nodes)}"
    assert not [n for n in task_scans(nodes) if n["Node Type"] == "Seq Scan"], shown
    assert indexes(nodes) == {"tasks_due_idx"}, f"NEXT_DUE misses tasks_due_idx: {shown}"
    [scan] = [n for n in nodes if n.get("Index Name") == "tasks_due_idx"]
    assert "runtime_id" in scan.get("Index Cond", ""), shown
    assert "run_at" in scan.get("Index Cond", ""), shown


LEASE_STATEMENTS = {
    "GET_TASK": (q.GET_TASK, ()),
    "HEARTBEAT": (q.HEARTBEAT, ("lease", 60.0)),
    "COMPLETE": (q.COMPLETE, ("lease", None)),
    "FAIL": (q.FAIL, ("lease", "boom", True, None)),
    "RELEASE": (q.RELEASE, ("lease",)),
    "CANCEL": (q.CANCEL, ()),
    "RETRY": (q.RETRY, ()),
}


@pytest.mark.parametrize("name", list(LEASE_STATEMENTS))
async def test_task_statements_find_the_row_by_primary_key(
    conn: asyncpg.Connection, filled: str, name: str
) -> None:
    sql, extra = LEASE_STATEMENTS[name]
    args = [uuid.uuid4()] + [uuid.uuid4() if a == "lease" else a for a in extra]
    raw = await conn.fetchval("EXPLAIN (FORMAT JSON) " + sql, *args)
    nodes = list(walk((json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]))
    shown = f"{name}: {describe(nodes)}"
    assert not [n for n in task_scans(nodes) if n["Node Type"] == "Seq Scan"], shown
    assert indexes(nodes) == {"tasks_pkey"}, shown


async def test_listing_walks_the_runtime_index(conn: asyncpg.Connection, filled: str) -> None:
    for status in (None, "queued"):
        raw = await conn.fetchval(
            "EXPLAIN (FORMAT JSON) " + q.LIST_TASKS, f"{filled}-17", status, None, None, 101
        )
        nodes = list(walk((json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]))
        shown = f"status={status}: {describe(nodes)}"
        assert not [n for n in task_scans(nodes) if n["Node Type"] == "Seq Scan"], shown
        # Unfiltered: the (runtime_id, created_at, id) index gives the order. With a status
        # filter the planner may prefer a partial index over that status's few rows.
        wanted = (
            {"tasks_runtime_created_idx"}
            if status is None
            else {"tasks_runtime_created_idx", "tasks_due_idx", "tasks_claim_idx"}
        )
        assert indexes(nodes) & wanted, shown
