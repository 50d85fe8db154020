"""Reading the plans of the gateway's statements, for the EXPLAIN tests
(tests/integration/test_*_explain.py, tests/e2e/test_*_explain.py): the realistic task
table they are judged on (`fill`, the `filled` fixture), a statement's plan as a
prepared statement runs it under custom or generic plans (`explain`, `plan_of`), and
what to look for in it (its task scans, its indexes, lists read again per row).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

import asyncpg

# The plan_cache_mode values every statement is judged under: the custom plans of a
# prepared statement's first five executions, and the generic plan it may switch to.
MODES = ["force_custom_plan", "force_generic_plan"]


RUNTIMES = 200
ROWS = 20_000
BACKLOG = 3_000

# Row n belongs to runtime n % 200. Per runtime: 100 rows, of which 5 queued and due,
# 2 scheduled (run_at in the future), 3 claimed, the rest completed / dead / cancelled.
FILL = """
INSERT INTO tasks (runtime_id, status, priority, payload, attempts, run_at, created_at,
                   updated_at, finished_at, lease_id, lease_expires_at, worker_id)
SELECT $1 || '-' || (n % $2),
       s.status,
       (n * 7) % 101,
       jsonb_build_object('n', n),
       CASE WHEN s.status IN ('queued', 'scheduled') THEN 0 ELSE 1 END,
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
                  WHEN (n / $2) % 100 IN (5, 6) THEN 'scheduled'
                  WHEN (n / $2) % 100 < 7 THEN 'queued'
                  WHEN (n / $2) % 100 < 10 THEN 'claimed'
                  WHEN (n / $2) % 100 < 12 THEN 'dead'
                  WHEN (n / $2) % 100 < 13 THEN 'cancelled'
                  ELSE 'completed' END AS status) AS s
"""


# A runtime with a backlog: queued tasks of mixed priority, a few of them delayed.
HOT = """
INSERT INTO tasks (runtime_id, status, priority, payload, run_at, created_at)
SELECT $1, CASE WHEN n % 50 = 0 THEN 'scheduled' ELSE 'queued' END,
       n % 3 * 50, jsonb_build_object('n', n),
       CASE WHEN n % 50 = 0 THEN now() + interval '10 minutes' ELSE now() END,
       now() - make_interval(secs => $2 - n)
  FROM generate_series(0, $2 - 1) AS n
"""


async def fill(conn: asyncpg.Connection, prefix: str) -> None:
    """The realistic table, under runtime ids `<prefix>-<n>` and `<prefix>-hot`, analyzed,
    on `conn` (the `plans_database` fixture of tests/conftest.py fills a database of its
    own with it, once per worker)."""
    await conn.execute(FILL, prefix, RUNTIMES, ROWS)
    await conn.execute(HOT, prefix + "-hot", BACKLOG)
    await conn.execute("ANALYZE tasks")


def walk(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from walk(child)


def literal(value: Any) -> str:
    """A SQL literal for the test's own (quote-free) values."""
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "ARRAY[" + ", ".join(literal(v) for v in value) + "]::text[]"
    if isinstance(value, list):
        return "ARRAY[" + ", ".join(repr(float(v)) for v in value) + "]::float8[]"
    raise TypeError(value)


async def explain(
    conn: asyncpg.Connection,
    sql: str,
    types: str,
    args: tuple[Any, ...],
    mode: str,
    *,
    analyze: bool = False,
) -> list[dict[str, Any]]:
    """EXPLAIN the statement as a prepared statement runs it, under `plan_cache_mode`
    `mode`: custom plans (the first five executions) or the generic plan Postgres may
    switch to afterwards (asyncpg prepares and caches every statement). With `analyze`
    it runs, inside a savepoint that is rolled back, and the plan carries the rows and
    buffers each node touched."""
    name = "explain_" + secrets.token_hex(4)
    options = "ANALYZE, BUFFERS, FORMAT JSON" if analyze else "FORMAT JSON"
    await conn.execute(f"SET LOCAL plan_cache_mode = {mode}")
    await conn.execute(f"PREPARE {name}{f'({types})' if types else ''} AS {sql}")
    savepoint = conn.transaction()
    await savepoint.start()
    try:
        # EXECUTE takes no bind parameters: the values go in as literals.
        values = ", ".join(literal(arg) for arg in args)
        call = f"{name}({values})" if values else name
        raw = await conn.fetchval(f"EXPLAIN ({options}) EXECUTE {call}")
    finally:
        await savepoint.rollback()
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


def subtree(node: dict[str, Any]) -> list[dict[str, Any]]:
    return list(walk(node))


def indexes(nodes: list[dict[str, Any]]) -> set[str]:
    return {n["Index Name"] for n in nodes if "Index Name" in n}


def typed_literal(value: Any, sql_type: str) -> str:
    """A SQL literal of the test's own (quote-free) value, an array of them, or NULL,
    cast to `sql_type`."""
    if value is None:
        return f"NULL::{sql_type}"
    if not isinstance(value, list):
        return f"'{value}'::{sql_type}"
    items = ", ".join("NULL" if v is None else f"'{v}'" for v in value)
    return f"ARRAY[{items}]::{sql_type}"


async def plan_of(
    conn: asyncpg.Connection,
    mode: str,
    sql: str,
    args: list[tuple[Any, str]],
) -> list[dict[str, Any]]:
    """The nodes of the plan of `sql` prepared with the types of `args` and run with
    their values, under the plan_cache_mode `mode` (EXPLAIN without ANALYZE: nothing
    runs)."""
    name = "explain_" + secrets.token_hex(4)
    await conn.execute(f"SET LOCAL plan_cache_mode = {mode}")
    types = ", ".join(t for _, t in args)
    await conn.execute(f"PREPARE {name}({types}) AS {sql}")
    try:
        values = ", ".join(typed_literal(v, t) for v, t in args)
        raw = await conn.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE {name}({values})")
    finally:
        await conn.execute(f"DEALLOCATE {name}")
    return list(walk((json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]))


def rescanned_lists(nodes: list[dict[str, Any]]) -> list[str]:
    """The lists (CTE results, unnest()ed arrays) that a nested loop reads again for
    each row of its outer side, unless that side is one row by its kind (CLAIM joins
    its leased rows to the one row of NEXT_DUE), and those a correlated subquery reads
    once per row it is evaluated for (a SubPlan; an InitPlan or a hashed SubPlan runs
    once). The one list a subquery may read per task is a token's runtime patterns
    (`p` in RUNTIME_COVERED, gateway/store/sql/acks.py), a handful. A CTE whose plan
    is one row by its kind counts as one row where it is scanned."""

    def below(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
        yield node
        for child in node.get("Plans", []):
            if child.get("Parent Relationship") not in ("SubPlan", "InitPlan"):
                yield from below(child)

    ctes = {n["Subplan Name"][4:]: n for n in nodes if n.get("Subplan Name", "").startswith("CTE ")}

    def one_row(node: dict[str, Any]) -> bool:
        # A Result over nothing but its InitPlans, or an aggregate with no groups, or a
        # scan of a CTE that is one of those (the enqueues' `base`: the batch's time).
        plans = [c for c in node.get("Plans", []) if c.get("Parent Relationship") != "InitPlan"]
        if node["Node Type"] == "CTE Scan" and node.get("CTE Name") in ctes:
            return one_row(ctes[node["CTE Name"]])
        return (node["Node Type"] == "Result" and not plans) or (
            node["Node Type"] == "Aggregate" and node.get("Strategy") == "Plain"
        )

    def lists(node: dict[str, Any]) -> list[str]:
        return [
            f"{n['Node Type']} {n.get('CTE Name', n.get('Alias', ''))}"
            for n in below(node)
            if n["Node Type"] in ("CTE Scan", "Function Scan", "WorkTable Scan")
        ]

    found = []
    for sub in (n for n in nodes if n.get("Parent Relationship") == "SubPlan"):
        if not sub.get("Subplan Name", "").startswith("hashed "):
            found += [f"{x} (per row)" for x in lists(sub) if x != "Function Scan p"]
    for loop in (n for n in nodes if n["Node Type"] == "Nested Loop"):
        [outer] = [c for c in loop["Plans"] if c.get("Parent Relationship") == "Outer"]
        [inner] = [c for c in loop["Plans"] if c.get("Parent Relationship") == "Inner"]
        if one_row(outer):
            continue
        found += lists(inner)
    return found
