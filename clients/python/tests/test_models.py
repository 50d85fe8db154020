"""The typed answers: times become aware datetimes (and go back out as the gateway's
RFC 3339 strings), and a naive time is refused rather than guessed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from gateway_client import Controls, ItemOutcome, NewTask, Stats, Task
from gateway_client.models import format_time, parse_time

TASK = {
    "id": "0190f0c4-0000-7000-8000-000000000001",
    "runtime_id": "demo",
    "status": "claimed",
    "priority": 50,
    "payload": {"n": 1},
    "attempts": 1,
    "max_attempts": 5,
    "run_at": "2026-11-27T16:55:44.123456Z",
    "expires_at": None,
    "created_at": "2026-11-27T16:55:44.000001Z",
    "updated_at": "2026-11-27T16:55:45.5Z",
    "lease_id": "0190f0c4-0000-7000-8000-000000000002",
    "lease_expires_at": "2026-11-27T17:55:45+01:00",
    "worker_id": "w1",
}


def test_a_task_s_times_are_aware_datetimes() -> None:
    task = Task.from_json(TASK)
    assert task.run_at == datetime(2026, 11, 27, 16, 55, 44, 123456, tzinfo=UTC)
    assert task.created_at == datetime(2026, 11, 27, 16, 55, 44, 1, tzinfo=UTC)
    assert task.updated_at == datetime(2026, 11, 27, 16, 55, 45, 500000, tzinfo=UTC)
    # Another offset is the same instant.
    assert task.lease_expires_at == datetime(2026, 11, 27, 16, 55, 45, tzinfo=UTC)
    assert task.expires_at is None and task.status == "claimed"
    assert task.raw["run_at"] == TASK["run_at"]  # as received


def test_stats_controls_and_batch_outcomes_parse_their_times() -> None:
    stats = Stats.from_json(
        {
            "runtime_id": "demo",
            "counts": {"queued": 2},
            "oldest_queued_age_seconds": 1.5,
            "parked_pollers": 0,
            "paused": True,
            "paused_since": "2026-11-27T16:00:00.000000Z",
            "paused_until": None,
        }
    )
    assert stats.paused_since == datetime(2026, 11, 27, 16, tzinfo=UTC)
    outcome = ItemOutcome.from_json(
        {"id": "x", "outcome": "queued", "run_at": "2026-11-27T16:00:30.000000Z"}
    )
    assert outcome.run_at == datetime(2026, 11, 27, 16, 0, 30, tzinfo=UTC)
    answered = {
        "runtime_id": "demo",
        "paused": True,
        "max_in_flight": 4,
        "claims_per_second": None,
        "updated_at": "2026-11-27T16:55:44.123456Z",
        "paused_reason": "failover",
        "paused_since": "2026-11-27T16:55:44.123456Z",
        "paused_until": "2026-11-27T18:00:00.000000Z",
    }
    controls = Controls.from_json(answered)
    assert controls.paused_until == datetime(2026, 11, 27, 18, tzinfo=UTC)
    assert controls.to_json() == answered  # `gateway runtime` prints what the gateway said


def test_times_sent_are_rfc_3339_in_utc() -> None:
    paris = timezone(timedelta(hours=1))
    at = datetime(2026, 11, 27, 19, 0, tzinfo=paris)
    assert NewTask(1, run_at=at).to_json()["run_at"] == "2026-11-27T18:00:00.000000Z"
    assert NewTask(1, run_at="2030-01-01T00:00:00Z").to_json()["run_at"] == "2030-01-01T00:00:00Z"
    assert format_time(datetime(2026, 1, 1, tzinfo=UTC)) == "2026-01-01T00:00:00.000000Z"


def test_a_time_without_a_zone_is_refused_not_guessed() -> None:
    with pytest.raises(ValueError, match="no time zone"):
        NewTask(1, run_at=datetime(2026, 11, 27, 19, 0)).to_json()
    with pytest.raises(ValueError, match="no UTC offset"):
        parse_time("2026-11-27T19:00:00")
