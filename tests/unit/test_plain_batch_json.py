"""The answer to a batch of items that set no time, written by the gateway from
Postgres's ids and payload texts (store.tasks.plain_tasks_json): it must be byte for
byte what models.task_bytes writes of each stored row, across second, day and year
boundaries of the microsecond-apart times. And the integer columns the batch
statements take as array literals."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import orjson
import pytest

from gateway.api.render import task_bytes
from gateway.api.requests import EnqueueRequest
from gateway.rows import TaskRow
from gateway.store.tasks import _int_array, plain_tasks_json


def request(priority: int, max_attempts: int) -> EnqueueRequest:
    return EnqueueRequest("null", priority, max_attempts, None, None, None, None, "")


@pytest.mark.parametrize(
    "start",
    [
        datetime(2026, 11, 26, 22, 30, 1, 123456, tzinfo=UTC),
        datetime(2026, 11, 26, 22, 30, 1, 999_998, tzinfo=UTC),  # a second boundary
        datetime(2026, 12, 31, 23, 59, 59, 999_000, tzinfo=UTC),  # a year boundary
        datetime(2026, 1, 1, 0, 0, 0, 0, tzinfo=UTC),
    ],
)
def test_the_plain_answer_is_what_models_writes_of_the_rows(start: datetime) -> None:
    n = 1500
    reqs = [request(i % 1001, 1 + i % 100) for i in range(n)]
    ids = [uuid.uuid4() for _ in range(n)]
    payloads = [f'{{"i": {i}, "s": "a\\nb"}}' if i % 3 else "[1, 2.50]" for i in range(n)]
    lines = "\n".join(str(task_id) + text for task_id, text in zip(ids, payloads, strict=True))
    written = plain_tasks_json("rt-1.a:b_c", reqs, start, lines)
    expected = []
    for i, (task_id, req, text) in enumerate(zip(ids, reqs, payloads, strict=True)):
        at = start + timedelta(microseconds=i)
        row = TaskRow(
            task_id, "rt-1.a:b_c", "queued", req.priority, orjson.Fragment(text), 0,
            req.max_attempts, start, None, at, at, None, None, None, False, None, None,
        )  # fmt: skip
        expected.append(task_bytes(row).decode())
    assert written == "[" + ",".join(expected) + "]"
    assert len(orjson.loads(written)) == n


def test_a_count_that_does_not_match_the_lines_is_refused() -> None:
    start = datetime(2026, 11, 26, tzinfo=UTC)
    with pytest.raises(ValueError):
        plain_tasks_json("rt", [request(50, 5)] * 2, start, str(uuid.uuid4()) + "1")


@pytest.mark.parametrize(
    "values", [[], [7], [50] * 1000, [5, 5, 6], [1, 2, 3], [0, 0], [-1, -1, -1], [3] * 999 + [4]]
)
def test_int_array_writes_every_value_in_order(values: list[int]) -> None:
    literal = _int_array(values)
    assert literal == "{" + ",".join(str(v) for v in values) + "}"
