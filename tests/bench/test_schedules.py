"""The schedules scenario: how it counts ticks, and its two targets."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from bench.cli import _scenarios
from bench.schedules import (
    RUNTIMES,
    count_ticks,
    expected_ticks,
    pass_cost,
    schedule_body,
    schedule_paths,
)
from bench.stats import Result
from bench.targets import evaluate

LAG = "schedules: tick lag p99 (10,000 schedules)"
DUPLICATES = "schedules: duplicate ticks"
T0 = datetime(2026, 11, 28, tzinfo=UTC)


def _rows(**numbers: Any) -> dict[str, Any]:
    base = {"schedules": 10_000, "ticks_expected": 40_000, "ticks_made": 40_000}
    rows = evaluate([Result("schedules", "10,000 schedules", numbers={**base, **numbers})])
    return {r.target: r for r in rows}


def test_the_lag_target_is_the_p99_within_one_second() -> None:
    rows = _rows(lag_p50_ms=300.0, lag_p99_ms=900.0, lag_max_ms=1100.0, duplicate_ticks=0)
    assert (rows[LAG].value, rows[LAG].verdict) == (0.9, "PASS")
    assert "40,000 of 40,000 ticks" in rows[LAG].shown
    rows = _rows(lag_p50_ms=300.0, lag_p99_ms=1200.0, lag_max_ms=1500.0, duplicate_ticks=0)
    assert rows[LAG].verdict == "MISS"


def test_one_duplicate_tick_misses() -> None:
    assert _rows(lag_p99_ms=500.0, duplicate_ticks=0)[DUPLICATES].verdict == "PASS"
    assert _rows(lag_p99_ms=500.0, duplicate_ticks=1)[DUPLICATES].verdict == "MISS"


def test_fewer_schedules_or_none_are_not_measured_never_pass() -> None:
    rows = _rows(schedules=1_000, lag_p99_ms=100.0, duplicate_ticks=0)
    assert rows[LAG].verdict == rows[DUPLICATES].verdict == "n/a"
    rows = {r.target: r for r in evaluate([])}
    assert rows[LAG].verdict == rows[DUPLICATES].verdict == "n/a"


def test_ticks_are_counted_by_key_with_duplicates_and_silent_gaps() -> None:
    a, b = ("rt-1", "s", T0), ("rt-1", "s", T0 + timedelta(seconds=10))
    other = ("rt-2", "s", T0)
    assert count_ticks([a, b, other], expected=3, skipped=0) == (3, 0, 0)
    # The same tick twice is one tick made and one duplicate.
    assert count_ticks([a, a, b], expected=2, skipped=0) == (2, 1, 0)
    # A tick with no task is a gap unless its skip is recorded.
    assert count_ticks([a], expected=3, skipped=0) == (1, 0, 2)
    assert count_ticks([a], expected=3, skipped=2) == (1, 0, 0)


def test_the_schedules_spread_over_the_runtimes_every_ten_seconds() -> None:
    paths = schedule_paths(10_000)
    assert len(set(paths)) == 10_000
    assert len({p.split("/")[3] for p in paths}) == RUNTIMES
    body = schedule_body(7)
    assert (body["every_seconds"], body["overlap"], body["jitter_seconds"]) == (10, "allow", 0)


def test_the_scenario_runs_by_name_and_in_all() -> None:
    assert _scenarios("schedules") == ["schedules"]
    assert "schedules" in _scenarios("all")


def test_the_pass_cost_is_read_from_the_transactions_of_whole_ticks() -> None:
    later = T0 + timedelta(seconds=10)
    batches = [
        # A tick only half the schedules had (made while they were created): left out.
        (T0, 500, 0.0, 0.1),
        # A whole tick in two transactions: 0.1 s and 0.3 s inside, 0.6 s between.
        (later, 500, 10.0, 10.1),
        (later, 500, 10.7, 11.0),
    ]
    cost = pass_cost(batches, schedules=1_000)
    assert cost["full_ticks"] == 1 and cost["batches_per_tick"] == 2
    assert cost["tick_write_p50_ms"] == 1000.0
    assert cost["insert_per_batch_p50_ms"] == 200.0
    assert cost["between_batches_p50_ms"] == 600.0
    assert pass_cost([], schedules=1_000)["tick_write_p50_ms"] is None


def test_ticks_are_expected_every_ten_seconds_from_each_first_tick() -> None:
    firsts = [T0, T0 + timedelta(seconds=10), T0 + timedelta(seconds=50)]
    # By T0 + 40 s: 5 ticks of the first (0..40), 4 of the second, none of the third.
    assert expected_ticks(firsts, T0 + timedelta(seconds=40)) == 9
    assert expected_ticks(firsts, T0 + timedelta(seconds=39.9)) == 7
