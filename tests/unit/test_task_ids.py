"""The ids the gateway chooses for new tasks itself (store.tasks.new_task_ids): the
form Postgres's default for tasks.id writes (migration 0009)."""

from __future__ import annotations

import time
import uuid

import pytest

from gateway.store.tasks import new_task_ids


def test_task_ids_are_distinct_uuids_of_version_7() -> None:
    ids = new_task_ids(3000)
    assert len(ids) == 3000 and len(set(ids)) == 3000
    for task_id in ids:
        parsed = uuid.UUID(str(task_id))
        assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
        assert task_id == parsed and hash(task_id) == hash(parsed)
    # The 74 random bits stay random: every hex digit outside the fixed ones varies.
    for position in (15, 20, 35):
        assert len({str(task_id)[position] for task_id in ids}) == 16


def test_task_ids_start_with_the_time_they_were_made() -> None:
    before = time.time_ns() // 1_000_000
    ids = new_task_ids(10)
    after = time.time_ns() // 1_000_000
    for task_id in ids:
        assert before <= int.from_bytes(task_id.bytes[:6], "big") <= after
    time.sleep(0.002)
    later = new_task_ids(1)[0]
    # A later millisecond sorts after, whatever the random bits.
    assert all(str(task_id) < str(later) for task_id in ids)


def test_task_ids_round_their_time_down(monkeypatch: pytest.MonkeyPatch) -> None:
    # 0.999999 ms past a millisecond is still in it, as Postgres's default has it.
    monkeypatch.setattr(time, "time_ns", lambda: 1_795_000_000_123_999_999)
    [task_id] = new_task_ids(1)
    assert int.from_bytes(task_id.bytes[:6], "big") == 1_795_000_000_123


def test_no_ids_for_an_empty_batch() -> None:
    assert new_task_ids(0) == []
