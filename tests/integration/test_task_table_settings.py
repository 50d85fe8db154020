"""The task table's own autovacuum settings (migration 0012), read back from the
catalog of a freshly migrated database: autovacuum starts on the task table after 1% of
its rows are dead (not a fifth), and runs without the cost-based delay."""

from __future__ import annotations

import pytest

from tests.support.databases import fetch

pytestmark = pytest.mark.integration

EXPECTED = {
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_vacuum_threshold": "1000",
    "autovacuum_analyze_scale_factor": "0.01",
    "autovacuum_analyze_threshold": "1000",
    "autovacuum_vacuum_cost_delay": "0",
}


async def test_the_task_table_has_autovacuum_settings_of_its_own(own_database_url: str) -> None:
    rows = await fetch(
        own_database_url,
        "SELECT unnest(reloptions) AS option FROM pg_class WHERE oid = 'tasks'::regclass",
    )
    options = dict(row["option"].split("=", 1) for row in rows)
    assert options == EXPECTED


async def test_the_settings_leave_the_other_tables_alone(own_database_url: str) -> None:
    rows = await fetch(
        own_database_url,
        "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'public' AND c.relkind = 'r' AND c.reloptions IS NOT NULL",
    )
    assert [row["relname"] for row in rows] == ["tasks"]
