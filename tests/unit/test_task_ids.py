"""The ids a batch enqueue chooses for its tasks (store_tasks.new_task_ids)."""

from __future__ import annotations

import uuid

from gateway.store_tasks import new_task_ids


def test_task_ids_are_distinct_random_uuids_of_version_4() -> None:
    ids = new_task_ids(3000)
    assert len(ids) == 3000 and len(set(ids)) == 3000
    for task_id in ids:
        parsed = uuid.UUID(str(task_id))
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122
        assert task_id == parsed and hash(task_id) == hash(parsed)
    # Random bits stay random: every hex digit outside the fixed ones varies.
    for position in (0, 15, 20, 35):
        assert len({str(task_id)[position] for task_id in ids}) == 16


def test_no_ids_for_an_empty_batch() -> None:
    assert new_task_ids(0) == []
