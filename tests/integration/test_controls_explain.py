"""The limited claim's own statements keep their indexes: the control row is found by
its primary key, and the count of a runtime's leased tasks is an index-only read of
tasks_live_idx, whose cost follows the runtime's leases, not the table. Same data and
method as test_claim_explain (tests/support/plans.py, a transaction rolled back
afterwards)."""

from __future__ import annotations

import asyncpg
import pytest

from gateway.store.sql import controls as control_sql
from tests.support.plans import MODES, describe, explain, task_scans

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("mode", MODES)
async def test_in_flight_count_reads_the_live_index_only(
    conn: asyncpg.Connection, filled: str, mode: str
) -> None:
    nodes = await explain(
        conn, control_sql.CONTROLS_IN_FLIGHT, "text", (filled + "-7",), mode, analyze=True
    )
    shown = describe(nodes)
    scans = task_scans(nodes)
    assert scans and not [n for n in scans if n["Node Type"] == "Seq Scan"], shown
    assert {n["Index Name"] for n in nodes if "Index Name" in n} == {"tasks_live_idx"}, shown
    # The runtime holds 3 leased tasks of its 100 rows: only those are read.
    assert [n["Actual Rows"] for n in scans] == [3], shown


@pytest.mark.parametrize(
    ("sql", "types", "args"),
    [
        (control_sql.CONTROLS_REFILL, "text", ("rt",)),
        (control_sql.CONTROLS_SPEND, "text, float8", ("rt", 1)),
        (control_sql.GET_CONTROLS, "text", ("rt",)),
    ],
)
async def test_control_row_statements_use_the_primary_key(
    conn: asyncpg.Connection, sql: str, types: str, args: tuple[object, ...]
) -> None:
    tx = conn.transaction()  # rolled back: the shared database is left as it was
    await tx.start()
    try:
        await conn.execute(
            "INSERT INTO runtime_controls (runtime_id) "
            "SELECT 'explain-' || n FROM generate_series(1, 5000) n"
        )
        await conn.execute("ANALYZE runtime_controls")
        for mode in MODES:
            nodes = await explain(conn, sql, types, args, mode)
            scans = [
                n
                for n in nodes
                if n.get("Relation Name") == "runtime_controls" and "Scan" in n["Node Type"]
            ]
            assert [n["Index Name"] for n in scans] == ["runtime_controls_pkey"], describe(nodes)
    finally:
        await tx.rollback()
