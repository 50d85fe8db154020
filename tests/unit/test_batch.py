"""The batch lease operations' parsers and per-item answers (gateway/http/handlers/batch.py)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from gateway.api import bodies, requests
from gateway.errors import BadRequest, LeaseLost, NotFound, PayloadTooLarge, ValidationFailed
from gateway.http.handlers import batch
from gateway.rows import ItemResult
from gateway.settings import Settings
from gateway.store.leases import lease_lost

LIMIT = 1000  # payload bytes


def items(n: int, **fields: Any) -> list[dict[str, Any]]:
    return [{"id": str(uuid.uuid4()), "lease_id": str(uuid.uuid4()), **fields} for _ in range(n)]


def refused(
    fn: Any, body: Any, field: str, index: int | None, kind: type = ValidationFailed
) -> str:
    """fn(body) raises `kind` naming `field` (and `index`); returns the detail."""
    with pytest.raises(kind) as info:
        fn(body)
    assert info.value.extra.get("field") == field, info.value.extra
    assert info.value.extra.get("index") == index, info.value.extra
    return info.value.detail


def complete(body: Any) -> list[batch.CompleteItem]:
    return batch.parse_complete_many(body, LIMIT, 8)


def heartbeat(body: Any) -> list[batch.HeartbeatItem]:
    return batch.parse_heartbeat_many(body, 45)


def test_complete_items_keep_their_order_and_results() -> None:
    body = items(3)
    body[1]["result"] = {"n": 1}
    parsed = complete({"tasks": body})
    assert [str(i.task_id) for i in parsed] == [b["id"] for b in body]
    assert [str(i.lease_id) for i in parsed] == [b["lease_id"] for b in body]
    assert [i.result_json for i in parsed] == [None, '{"n":1}', None]


def test_fail_items_read_as_the_single_fail() -> None:
    body = items(2, error="boom")
    body[1].update(retry=False, retry_after_seconds=5, error="x" * 20_000)
    first, second = batch.parse_fail_many({"tasks": body})
    assert first.request == requests.parse_fail(body[0])
    assert (first.request.retry, first.request.retry_after_seconds) == (True, None)
    assert (second.request.retry, second.request.retry_after_seconds) == (False, 5.0)
    assert len(second.request.error) == bodies.MAX_ERROR_CHARS


def test_heartbeat_lease_seconds_default_per_item() -> None:
    body = items(2)
    body[0]["lease_seconds"] = 600
    assert [i.lease_seconds for i in heartbeat({"tasks": body})] == [600, 45]


@pytest.mark.parametrize("tasks", [None, [], {}, "tasks"])
def test_a_batch_needs_a_list_of_items(tasks: Any) -> None:
    for fn in (complete, heartbeat, batch.parse_fail_many):
        refused(fn, {"tasks": tasks}, "tasks", None)


def test_more_than_a_thousand_items_are_refused_with_the_count() -> None:
    assert len(complete({"tasks": items(1000)})) == 1000
    detail = refused(complete, {"tasks": items(1001)}, "tasks", None)
    assert "1001" in detail and "1000" in detail


def test_a_task_named_twice_is_refused_naming_both_places() -> None:
    body = items(4)
    body[3]["id"] = body[1]["id"]
    detail = refused(complete, {"tasks": body}, "tasks[3].id", 3)
    assert detail.startswith("tasks[3]: ") and "tasks[1]" in detail
    # The same task spelled in upper case is the same task.
    body[3]["id"] = body[1]["id"].upper()
    refused(heartbeat, {"tasks": body}, "tasks[3].id", 3)


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"id": "not-a-uuid"}, "tasks[2].id"),
        ({"id": None}, "tasks[2].id"),
        ({"lease_id": 7}, "tasks[2].lease_id"),
        ({"lease_id": None}, "tasks[2].lease_id"),
    ],
)
def test_a_malformed_item_is_refused_naming_it(bad: dict[str, Any], field: str) -> None:
    body = items(3)
    body[2].update(bad)
    refused(complete, {"tasks": body}, field, 2)


def test_an_item_that_is_not_an_object_is_refused() -> None:
    body: list[Any] = [*items(1), ["id"]]
    assert refused(heartbeat, {"tasks": body}, "tasks[1]", 1).startswith("tasks[1]: ")


def test_each_result_is_held_to_the_payload_limit() -> None:
    body = items(2)
    body[1]["result"] = "x" * LIMIT
    refused(complete, {"tasks": body}, "tasks[1].result", 1, PayloadTooLarge)
    body[1]["result"] = "\x00"
    refused(complete, {"tasks": body}, "tasks[1].result", 1)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({}, "tasks[0].error"),
        ({"error": 3}, "tasks[0].error"),
        ({"error": "e", "retry": "yes"}, "tasks[0].retry"),
        ({"error": "e", "retry_after_seconds": -1}, "tasks[0].retry_after_seconds"),
    ],
)
def test_fail_items_are_checked_as_the_single_fail(extra: dict[str, Any], field: str) -> None:
    refused(batch.parse_fail_many, {"tasks": items(1, **extra)}, field, 0)


def test_lease_seconds_out_of_range_is_refused() -> None:
    refused(heartbeat, {"tasks": items(1, lease_seconds=3601)}, "tasks[0].lease_seconds", 0)


def test_item_errors_keep_their_kind() -> None:
    """A bad item is a 4xx of the same kind as on the single endpoint: never a 500."""
    for kind in (ValidationFailed, PayloadTooLarge, BadRequest):
        with pytest.raises(kind):
            with batch._naming(4):
                raise kind("broken", field="x")


# -- a claim's reports (bodies.CLAIM_BODY's complete and fail) ----------------------------


def acks(body: Any) -> batch.Acks | None:
    return batch.parse_acks(body, Settings(max_payload_bytes=LIMIT, max_json_depth=8))


def test_a_claim_without_reports_has_none_and_empty_lists_are_reports() -> None:
    assert acks({"worker_id": "w"}) is None
    assert acks({"worker_id": "w", "complete": []}) == batch.Acks([], [])
    reports = acks({"complete": items(2, result=1), "fail": items(1, error="e")})
    assert reports is not None
    assert [i.result_json for i in reports.completes] == ["1", "1"]
    assert [i.request.error for i in reports.fails] == ["e"]


def test_a_claims_reports_hold_1000_items_together() -> None:
    assert acks({"complete": items(500), "fail": items(500, error="e")}) is not None
    detail = refused(acks, {"complete": items(600), "fail": items(401, error="e")}, "fail", None)
    assert "1001" in detail and "1000" in detail
    refused(acks, {"complete": items(1001)}, "complete", None)


def test_a_claims_reports_name_each_task_once_and_each_bad_item() -> None:
    done, failed = items(1), items(1, error="e")
    failed[0]["id"] = done[0]["id"]
    detail = refused(acks, {"complete": done, "fail": failed}, "fail[0].id", 0)
    assert "complete[0]" in detail
    refused(acks, {"complete": [{"id": "x"}]}, "complete[0].id", 0)
    refused(acks, {"fail": items(1)}, "fail[0].error", 0)
    refused(
        acks, {"complete": items(1, result="x" * LIMIT)}, "complete[0].result", 0, PayloadTooLarge
    )
    refused(acks, {"complete": None}, "complete", None)


# -- answers ---------------------------------------------------------------------------

TASK = uuid.uuid4()
LEASE = uuid.uuid4()
WHEN = datetime(2026, 11, 26, 9, 0, 0, 123456, tzinfo=UTC)


def test_an_item_refused_carries_the_single_operations_problem() -> None:
    error = lease_lost(TASK, LEASE, "completed")
    entry = batch.complete_entry(ItemResult(TASK, "rt", "completed", error))
    assert entry == {
        "id": str(TASK),
        "outcome": "lease_lost",
        "problem": {
            "type": "about:blank",
            "title": "Lease lost",
            "status": 409,
            "detail": error.detail,
            "code": "lease_lost",
            "task_status": "completed",
        },
    }
    assert isinstance(error, LeaseLost) and str(LEASE) in error.detail
    missing = batch.heartbeat_entry(
        ItemResult(TASK, None, None, NotFound(f"no task with id {TASK}"))
    )
    assert missing["outcome"] == "not_found" and missing["problem"]["status"] == 404
    assert set(missing) == {"id", "outcome", "problem"}


def test_outcomes_and_what_each_adds() -> None:
    assert batch.complete_entry(ItemResult(TASK, "rt", "cancelled")) == {
        "id": str(TASK),
        "outcome": "cancelled",
    }
    queued = batch.fail_entry(ItemResult(TASK, "rt", "queued", run_at=WHEN))
    assert queued == {"id": str(TASK), "outcome": "queued", "run_at": "2026-11-26T09:00:00.123456Z"}
    assert batch.fail_entry(ItemResult(TASK, "rt", "dead", run_at=WHEN)) == {
        "id": str(TASK),
        "outcome": "dead",
    }
    beat = batch.heartbeat_entry(
        ItemResult(TASK, "rt", "claimed", lease_expires_at=WHEN, cancel_requested=True)
    )
    assert beat == {
        "id": str(TASK),
        "outcome": "extended",
        "lease_expires_at": "2026-11-26T09:00:00.123456Z",
        "cancel_requested": True,
    }
