"""`python -m bench.capacity`'s Postgres part against the real server: every phase runs
the gateway's Store without errors, counts what it did, and the database it made is
gone afterwards."""

from __future__ import annotations

import asyncpg
import pytest

from bench.capacity import parser, postgres_part

pytestmark = pytest.mark.integration

PHASES = [
    "enqueue",
    "claim",
    "complete",
    "claim-empty",
    "lifecycle",
    "lifecycle-batch",
    "token-lookup",
    "enqueue-batch",
]


async def _database_exists(admin_url: str, name: str) -> bool:
    conn = await asyncpg.connect(admin_url)
    try:
        return bool(await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name))
    finally:
        await conn.close()


@pytest.mark.timeout(90)
async def test_every_phase_runs_and_the_database_is_dropped(pg_admin_url: str) -> None:
    args = parser().parse_args(
        [
            "--connections", "2", "--phase-seconds", "0.5", "--runtimes", "4",
            "--tokens", "3", "--batch-size", "5", "--max-tasks", "3",
        ]
    )  # fmt: skip

    part = await postgres_part(args, pg_admin_url)

    results = {r.phase: r for r in part["_results"]}
    assert list(results) == PHASES
    for r in results.values():
        assert r.errors == 0, r
        assert r.calls > 0, r
    # Each call's tasks, as the phase defines them.
    assert results["enqueue"].tasks == results["enqueue"].calls
    assert results["enqueue-batch"].tasks == 5 * results["enqueue-batch"].calls
    assert results["lifecycle"].tasks == results["lifecycle"].calls
    assert results["lifecycle-batch"].tasks == 3 * results["lifecycle-batch"].calls
    assert results["claim-empty"].tasks == 0
    assert 0 < results["claim"].tasks <= results["enqueue"].tasks
    # Every task claim leased was completed, or the phase ran out of time first.
    assert 0 < results["complete"].tasks <= results["claim"].tasks
    if part["cpu_measured"]:
        assert sum(r.pg_cpu_seconds or 0.0 for r in results.values()) > 0
    assert part["bytes_per_row_heap"] > 0 and part["bytes_per_row_indexes"] > 0
    assert part["database"].startswith("bench_")
    assert not await _database_exists(pg_admin_url, part["database"])


def test_a_phase_is_bounded_to_twenty_seconds(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["--phase-seconds", "21"])
    assert "at most 20" in capsys.readouterr().err
    assert parser().parse_args(["--phase-seconds", "20"]).phase_seconds == 20.0
