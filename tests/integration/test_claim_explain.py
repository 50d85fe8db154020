"""The hot-path statements keep their indexes: CLAIM walks tasks_claim_idx and the due
end of tasks_scheduled_idx, NEXT_DUE probes tasks_scheduled_idx, and neither scans the
whole task table nor walks delayed tasks.

The data is realistic and the planner chooses on its own (no enable_seqscan): 20,000
rows over 200 runtimes, nearly all finished, a few queued per runtime (some delayed,
so stored `scheduled`), plus one "hot" runtime with a backlog of 3,000 queued tasks.
A second data set puts 300,000 delayed tasks of a higher priority ahead of a
runtime's due ones, and counts the rows and buffers the statements touch.
The first set is filled once, in a database of its own (the `plans_database` fixture);
the second in the test's transaction. Each test's transaction is rolled back, so
every test sees the same rows and statistics, and the session's shared database is
left as it was.
"""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from gateway.store.leases import CLAIM_WINDOW
from gateway.store.sql import janitor as janitor_sql
from gateway.store.sql import leases as lease_sql
from gateway.store.sql import tasks as task_sql
from tests.support.plans import (
    BACKLOG,
    MODES,
    ROWS,
    RUNTIMES,
    describe,
    explain,
    indexes,
    plan_of,
    subtree,
    task_scans,
    walk,
)

pytestmark = pytest.mark.integration

CLAIM_TYPES = "text, text[], float8[], int"


def claim_args(runtime: str) -> tuple[Any, ...]:
    workers = [f"w{i}" for i in range(5)]
    return (runtime, workers, [60.0, 60.0, 30.0, 120.0, 60.0], len(workers) + CLAIM_WINDOW)


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
    assert counts["queued"] == RUNTIMES * 5 + BACKLOG - BACKLOG // 50
    assert counts["scheduled"] == RUNTIMES * 2 + BACKLOG // 50
    assert counts["completed"] > ROWS * 0.8
    runtimes = await conn.fetchval(
        "SELECT count(DISTINCT runtime_id) FROM tasks WHERE runtime_id LIKE $1", filled + "-%"
    )
    assert runtimes == RUNTIMES + 1
    # The statements under test work on this data (the claim is undone by a savepoint).
    savepoint = conn.transaction()
    await savepoint.start()
    try:
        rows = await conn.fetch(lease_sql.CLAIM, *claim_args(f"{filled}-17"))
        assert sorted(r["slot"] for r in rows) == [1, 2, 3, 4, 5]
        assert {r["runtime_id"] for r in rows} == {f"{filled}-17"}
        # Only when fewer were found does the store use due_in; it is always there.
        assert all(3500 < r["due_in"] <= 3600 for r in rows)
    finally:
        await savepoint.rollback()
    assert await conn.fetchval(lease_sql.NEXT_DUE, f"{filled}-17") is not None
    hot = await conn.fetchval(
        "SELECT count(*) FROM tasks WHERE runtime_id = $1 AND status IN ('queued', 'scheduled')",
        filled + "-hot",
    )
    assert hot == BACKLOG


def path_to(root: dict[str, Any], target: dict[str, Any]) -> list[str]:
    """The node types from `root` down to `target`, both included ([] if not below)."""
    if root is target:
        return [root["Node Type"]]
    for child in root.get("Plans", []):
        below = path_to(child, target)
        if below:
            return [root["Node Type"], *below]
    return []


def check_claim_plan(nodes: list[dict[str, Any]], shown: str, *, backlog: bool) -> None:
    """CLAIM's shape: the candidates come from two index scans seeking on the runtime,
    each under the window's LIMIT, merged in claim order; a LIMIT of the slots wanted
    over a nested loop locks them one by one by primary key, so that it stops once
    enough are held; the leased rows are updated by primary key. Nothing else is read.
    With a backlog, the claim index is walked in order, with no sort in between."""
    assert not [n for n in task_scans(nodes) if n["Node Type"] == "Seq Scan"], shown
    # Each arm seeks on the runtime through its own index, or, on a runtime with few
    # live rows, through tasks_live_idx (all of the runtime's live rows, a handful
    # here). With a million delayed rows the planner must take the scheduled index's
    # due end: tests/integration/test_claim_statement.py pins that on a large table.
    own = {"tasks_claim_idx", "tasks_scheduled_idx"}
    assert indexes(nodes) <= own | {"tasks_live_idx", "tasks_pkey"}, shown
    [merge] = [n for n in nodes if n["Node Type"] == "Merge Append"]
    arms = [n for n in subtree(merge) if "Index Name" in n]
    assert len(arms) == 2, shown
    for scan in arms:
        assert path_to(merge, scan)[:2] == ["Merge Append", "Limit"], shown
        assert "runtime_id" in scan.get("Index Cond", ""), shown
    sources = {n["Index Name"]: n for n in arms}
    # Where the scheduled index is read, only its due end is: delayed rows are never
    # read. NEXT_DUE's probe of the earliest future run_at uses it too.
    scheduled = [n for n in nodes if n.get("Index Name") == "tasks_scheduled_idx"]
    assert scheduled, shown
    for scan in scheduled:
        assert "run_at" in scan.get("Index Cond", ""), shown
    if backlog:
        queued = sources["tasks_claim_idx"]
        assert path_to(merge, queued) == ["Merge Append", "Limit", "Index Scan"], shown
    [lock] = [n for n in nodes if n["Node Type"] == "LockRows"]
    assert [n.get("Index Name") for n in task_scans(subtree(lock))] == ["tasks_pkey"], shown
    limits = [n for n in nodes if n["Node Type"] == "Limit" and path_to(n, lock)]
    assert limits, f"the lock is not under the LIMIT: {shown}"
    assert path_to(limits[0], lock) == ["Limit", "Nested Loop", "Subquery Scan", "LockRows"], shown


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("which", ["17", "hot"])
async def test_claim_uses_the_claim_index(
    conn: asyncpg.Connection, filled: str, mode: str, which: str
) -> None:
    """On a quiet runtime and on one with a backlog, under custom and generic plans."""
    runtime = f"{filled}-{which}"
    # EXPLAIN without ANALYZE does not run the UPDATE; the fixture's transaction is
    # rolled back in any case.
    nodes = await explain(conn, lease_sql.CLAIM, CLAIM_TYPES, claim_args(runtime), mode)
    check_claim_plan(nodes, f"{mode}, {which}: {describe(nodes)}", backlog=which == "hot")


# CLAIM_ACKED's own parts: its carried completes (BATCH_COMPLETE's shape, which
# tests/e2e/test_batch_explain.py holds), and the answer that gathers their outcomes.
CARRIED_CTES = ("CTE items", "CTE seen", "CTE locked", "CTE done", "CTE answer")


def claim_part(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The plan's nodes less those of its carried completes."""
    skipped: set[int] = set()
    for node in nodes:
        if node.get("Subplan Name") in CARRIED_CTES or "answer" in node.get("Subplan Name", ""):
            skipped.update(id(n) for n in subtree(node))
    return [n for n in nodes if id(n) not in skipped]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("which", ["17", "hot"])
async def test_a_claim_carrying_completes_keeps_the_claims_plan(
    conn: asyncpg.Connection, filled: str, mode: str, which: str
) -> None:
    """CLAIM_ACKED claims exactly as CLAIM does: the completes it applies beside the
    claim change nothing in how the claim finds and locks its tasks."""
    runtime = f"{filled}-{which}"
    completes = (
        ([uuid.uuid4() for _ in range(3)], "uuid[]"),
        ([uuid.uuid4() for _ in range(3)], "uuid[]"),
        (['{"ok": 1}', None, "2"], "text[]"),
        ([None, "explain-*", "a b"], "text[]"),
    )
    types = [t.strip() for t in CLAIM_TYPES.split(",")]
    args = [*zip(claim_args(runtime), types, strict=True), *completes]
    nodes = claim_part(await plan_of(conn, mode, lease_sql.CLAIM_ACKED, args))
    check_claim_plan(nodes, f"{mode}, {which}: {describe(nodes)}", backlog=which == "hot")


# A drain's claim: one poll of many slots on a runtime with a backlog. On a table of
# a few ten thousand rows the planner priced 160 primary-key probes above one pass over
# the table, and joined the leased rows to it by hashing the whole table.
WIDE = 160


def wide_claim_args(runtime: str) -> tuple[Any, ...]:
    workers = [f"w{i}" for i in range(WIDE)]
    return (runtime, workers, [60.0] * WIDE, WIDE + CLAIM_WINDOW)


def check_reads_tasks_by_index(nodes: list[dict[str, Any]], shown: str) -> None:
    assert not [n for n in task_scans(nodes) if n["Node Type"] == "Seq Scan"], shown
    [update] = [n for n in nodes if n["Node Type"] == "ModifyTable"]
    assert update["Actual Rows"] == WIDE, shown
    # Under the UPDATE, tasks is read through its primary key alone, a row per slot.
    below = subtree(update)
    assert indexes(below) == {"tasks_pkey"}, shown
    assert rows_read(below) <= WIDE + 10, (rows_read(below), shown)


# Whether the planner prices 160 probes above one pass over the table depends on the
# table's size on disk, which the tests before (their rows rolled back) grow. With
# nested loops priced out, it must join the leased rows some other way: the check
# then holds whatever ran before.
NO_NESTED_LOOPS = "SET LOCAL enable_nestloop = off"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("no_loops", [False, True], ids=["planner-defaults", "no-nested-loops"])
async def test_a_wide_claim_updates_its_rows_by_primary_key(
    conn: asyncpg.Connection, filled: str, mode: str, no_loops: bool
) -> None:
    """160 slots on the runtime with 3,000 queued tasks, in a table of 23,000 rows:
    the leased rows are found by primary key, never by reading the table, even when
    the planner may not loop over probes."""
    if no_loops:
        await conn.execute(NO_NESTED_LOOPS)
    nodes = await explain(
        conn, lease_sql.CLAIM, CLAIM_TYPES, wide_claim_args(f"{filled}-hot"), mode, analyze=True
    )
    check_reads_tasks_by_index(nodes, f"{mode}: {describe(nodes)}")


async def test_the_wide_claim_check_catches_the_join_by_id_alone(
    conn: asyncpg.Connection, filled: str
) -> None:
    """Control: CLAIM with the leased rows joined on `t.id = s.id` alone, as it was,
    reads the whole table when the planner may not loop over probes, and the check
    above fails on it."""
    probe = "t.id = ANY (ARRAY[s.id])"
    assert probe in lease_sql.CLAIM
    old = lease_sql.CLAIM.replace(probe, "t.id = s.id")
    await conn.execute(NO_NESTED_LOOPS)
    nodes = await explain(
        conn, old, CLAIM_TYPES, wide_claim_args(f"{filled}-hot"), MODES[0], analyze=True
    )
    with pytest.raises(AssertionError):
        check_reads_tasks_by_index(nodes, describe(nodes))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("which", ["17", "hot"])
async def test_next_due_uses_the_scheduled_index(
    conn: asyncpg.Connection, filled: str, mode: str, which: str
) -> None:
    nodes = await explain(conn, lease_sql.NEXT_DUE, "text", (f"{filled}-{which}",), mode)
    shown = f"{mode}, {which}: {describe(nodes)}"
    assert not [n for n in task_scans(nodes) if n["Node Type"] == "Seq Scan"], shown
    assert indexes(nodes) == {"tasks_scheduled_idx"}, f"NEXT_DUE misses its index: {shown}"
    [scan] = [n for n in nodes if n.get("Index Name") == "tasks_scheduled_idx"]
    assert "runtime_id" in scan.get("Index Cond", ""), shown
    assert "run_at" in scan.get("Index Cond", ""), shown


LEASE_STATEMENTS = {
    "GET_TASK": (task_sql.GET_TASK, ()),
    "HEARTBEAT": (lease_sql.HEARTBEAT, ("lease", 60.0)),
    "COMPLETE": (lease_sql.COMPLETE, ("lease", None)),
    "FAIL": (lease_sql.FAIL, ("lease", "boom", True, None)),
    "RELEASE": (lease_sql.RELEASE, ("lease",)),
    "CANCEL": (task_sql.CANCEL, ()),
    "RETRY": (task_sql.RETRY, ()),
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
            "EXPLAIN (FORMAT JSON) " + task_sql.LIST_TASKS, f"{filled}-17", status, None, None, 101
        )
        nodes = list(walk((json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]))
        shown = f"status={status}: {describe(nodes)}"
        assert not [n for n in task_scans(nodes) if n["Node Type"] == "Seq Scan"], shown
        # Unfiltered: the (runtime_id, created_at, id) index gives the order. With a status
        # filter the planner may prefer a partial index over that status's few rows.
        wanted = (
            {"tasks_runtime_created_idx"}
            if status is None
            else {"tasks_runtime_created_idx", "tasks_scheduled_idx", "tasks_claim_idx"}
        )
        assert indexes(nodes) & wanted, shown


# -- delayed tasks ahead of due ones ---------------------------------------------------

DELAYED = 300_000
DUE = 20

# The runtime's delayed tasks, all of a higher priority than its due ones, stored as
# `status` ($3) says; then its due tasks, queued.
FILL_DELAYED = """
INSERT INTO tasks (runtime_id, status, priority, payload, run_at, created_at)
SELECT $1, $3, 900, '{}'::jsonb, now() + make_interval(secs => 60 + n),
       now() - make_interval(secs => $2 - n)
  FROM generate_series(1, $2) AS n
"""
FILL_DUE = """
INSERT INTO tasks (runtime_id, priority, payload, run_at, created_at)
SELECT $1, 10, '{}'::jsonb, now() - interval '1 second', now() + make_interval(secs => n)
  FROM generate_series(1, $2) AS n
"""

# The claim before delayed tasks had a status of their own: one scan of the claim
# index, whose first DELAYED entries are the delayed tasks. The control below shows
# that the bounds of the test catch that walk.
OLD_CLAIM = """
WITH picked AS (
    SELECT id, priority, created_at FROM tasks
     WHERE runtime_id = $1 AND status = 'queued' AND run_at <= now()
       AND (expires_at IS NULL OR expires_at > now())
     ORDER BY priority DESC, created_at ASC
     LIMIT cardinality($2::text[])
       FOR UPDATE SKIP LOCKED
)
UPDATE tasks t SET status = 'claimed', attempts = t.attempts + 1,
       lease_id = gen_random_uuid(), lease_expires_at = now() + interval '1 minute'
  FROM picked WHERE t.id = picked.id
RETURNING t.id
"""

# What one claim of five tasks may touch: a few dozen rows and pages (the plan reads
# five due rows, locks them by primary key, updates them, and probes NEXT_DUE). The
# old claim read all DELAYED delayed rows' index entries and heap tuples.
MAX_ROWS_READ = 100
MAX_BUFFERS = 300


def rows_read(nodes: list[dict[str, Any]]) -> int:
    """Rows the task scans returned or filtered out, over all their loops."""
    return sum(
        (n.get("Actual Rows", 0) + n.get("Rows Removed by Filter", 0)) * n.get("Actual Loops", 1)
        for n in task_scans(nodes)
    )


def buffers(plan_root: dict[str, Any]) -> int:
    return int(plan_root.get("Shared Hit Blocks", 0) + plan_root.get("Shared Read Blocks", 0))


@pytest.fixture
async def delayed(conn: asyncpg.Connection) -> AsyncIterator[str]:
    """One runtime with DELAYED delayed tasks of priority 900 stored `scheduled`, and
    DUE due tasks of priority 10; in a transaction rolled back afterwards."""
    runtime = "delayed-" + secrets.token_hex(4)
    tx = conn.transaction()
    await tx.start()
    try:
        await conn.execute(FILL_DELAYED, runtime, DELAYED, "scheduled")
        await conn.execute(FILL_DUE, runtime, DUE)
        await conn.execute("ANALYZE tasks")
        yield runtime
    finally:
        await tx.rollback()


async def test_claim_and_next_due_do_not_walk_delayed_tasks(
    conn: asyncpg.Connection, delayed: str
) -> None:
    """With 300,000 delayed tasks of a higher priority ahead of the due ones, a claim
    and its due-time probe touch a few dozen rows and pages, not the delayed ones;
    under custom and generic plans (one fill for both: it is the slow part)."""
    for mode in MODES:
        nodes = await explain(
            conn, lease_sql.CLAIM, CLAIM_TYPES, claim_args(delayed), mode, analyze=True
        )
        shown = f"{mode}: {describe(nodes)}"
        [update] = [n for n in nodes if n["Node Type"] == "ModifyTable"]
        assert update["Actual Rows"] == 5, f"the claim leased {update['Actual Rows']}: {shown}"
        assert rows_read(nodes) <= MAX_ROWS_READ, (rows_read(nodes), shown)
        assert buffers(nodes[0]) <= MAX_BUFFERS, (buffers(nodes[0]), shown)

        nodes = await explain(conn, lease_sql.NEXT_DUE, "text", (delayed,), mode, analyze=True)
        assert rows_read(nodes) <= 2, describe(nodes)
        assert buffers(nodes[0]) <= 10, describe(nodes)

        # The janitor's promotion probes each runtime with scheduled tasks for due ones
        # (other tests' runtimes too): it does not walk the delayed ones either.
        nodes = await explain(
            conn, janitor_sql.PROMOTE_SCHEDULED, "int", (1000,), mode, analyze=True
        )
        shown = f"{mode}: {describe(nodes)}"
        assert not [n for n in task_scans(nodes) if n["Node Type"] == "Seq Scan"], shown
        waiting = await conn.fetchval(
            "SELECT count(DISTINCT runtime_id) FROM tasks WHERE status = 'scheduled'"
        )
        [promote] = [n for n in nodes if n["Node Type"] == "ModifyTable"]
        assert rows_read(nodes) <= 4 * waiting + 3 * promote["Actual Rows"] + 10, (
            rows_read(nodes),
            shown,
        )


async def test_the_bounds_catch_the_old_claims_walk(conn: asyncpg.Connection) -> None:
    """Control: the claim as it was, on delayed tasks stored `queued`, breaks both
    bounds (so the test above would fail on it). A third of the delayed tasks is
    enough to show it, in a third of the time."""
    runtime = "delayed-old-" + secrets.token_hex(4)
    tx = conn.transaction()
    await tx.start()
    try:
        await conn.execute(FILL_DELAYED, runtime, DELAYED // 3, "queued")
        await conn.execute(FILL_DUE, runtime, DUE)
        await conn.execute("ANALYZE tasks")
        nodes = await explain(
            conn, OLD_CLAIM, "text, text[]", claim_args(runtime)[:2], MODES[0], analyze=True
        )
    finally:
        await tx.rollback()
    shown = describe(nodes)
    [update] = [n for n in nodes if n["Node Type"] == "ModifyTable"]
    assert update["Actual Rows"] == 5, shown
    assert rows_read(nodes) > DELAYED // 3, (rows_read(nodes), shown)
    # The pages it reads depend on how much the table has grown (dead rows of earlier
    # tests, rolled back): on a fresh database about 1,700, after other tests several
    # thousand. Either way well past the bound.
    assert buffers(nodes[0]) > 3 * MAX_BUFFERS, (buffers(nodes[0]), shown)
