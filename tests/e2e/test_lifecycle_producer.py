"""Producers through the HTTP API: enqueue defaults, ordering, refusals, auth,
delays and TTLs (design sections 4 and 5)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import pytest_asyncio

from tests.support.gateways import gateway
from tests.support.http import get_task, req
from tests.support.lifecycle import (
    TIME_RE,
    UUID_RE,
    all_tasks,
    assert_problem,
    claim,
    claim_one,
    enqueue,
    now_rfc3339,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def small_gw(database_url, redis_url):
    """Payloads up to 1000 bytes, request bodies up to 4096 bytes."""
    async with gateway(
        database_url, redis_url, max_payload_bytes=1000, max_body_bytes=4096
    ) as inst:
        yield inst


# -- enqueue --------------------------------------------------------------------------


async def test_enqueue_defaults(gw, runtime_id):
    before = now_rfc3339()
    resp = await req(gw, "POST", f"/v1/runtimes/{runtime_id}/tasks", {"payload": {"a": [1, 2]}})
    after = now_rfc3339()
    assert resp.status == 201, resp.body
    assert resp.content_type == "application/json"
    task = resp.body
    assert UUID_RE.match(task["id"]), task
    assert task["runtime_id"] == runtime_id
    assert task["status"] == "queued"
    assert task["priority"] == 50
    assert task["max_attempts"] == 5
    assert task["attempts"] == 0
    assert task["payload"] == {"a": [1, 2]}
    assert task["expires_at"] is None
    for key in ("run_at", "created_at", "updated_at"):
        assert TIME_RE.match(task[key]), (key, task[key])
        assert before <= task[key] <= after, (key, task[key], before, after)
    for key in ("lease_id", "lease_expires_at", "worker_id", "result", "last_error"):
        assert key not in task, (key, task)
    assert await get_task(gw, task["id"]) == task


@pytest.mark.parametrize("payload", [None, 0, "text", [1, "two"], {"nested": {"x": None}}])
async def test_enqueue_accepts_any_json_payload(gw, runtime_id, payload):
    task = await enqueue(gw, runtime_id, payload)
    assert task["payload"] == payload
    assert (await claim_one(gw, runtime_id))["payload"] == payload


async def test_priority_higher_first_fifo_within(gw, runtime_id):
    order = [("a", 50), ("b", 50), ("c", 900), ("d", 0), ("e", 900), ("f", 1000), ("g", 50)]
    for name, priority in order:
        task = await enqueue(gw, runtime_id, name, priority=priority)
        assert task["priority"] == priority
    first_two = await claim(gw, runtime_id, max_tasks=2)
    assert [t["payload"] for t in first_two] == ["f", "c"]
    rest = [(await claim_one(gw, runtime_id))["payload"] for _ in range(5)]
    assert rest == ["e", "a", "b", "g", "d"]
    assert await claim(gw, runtime_id) == []


BAD_FIELDS = [
    ("priority", {"priority": -1}),
    ("priority", {"priority": 1001}),
    ("priority", {"priority": "high"}),
    ("priority", {"priority": 1.5}),
    ("priority", {"priority": True}),
    ("priority", {"priority": [1]}),
    ("max_attempts", {"max_attempts": 0}),
    ("max_attempts", {"max_attempts": 101}),
    ("max_attempts", {"max_attempts": "3"}),
    ("delay_seconds", {"delay_seconds": -1}),
    ("delay_seconds", {"delay_seconds": "10"}),
    ("run_at", {"run_at": "2030-01-01T00:00:00"}),
    ("run_at", {"run_at": "tomorrow"}),
    ("run_at", {"run_at": 1234567890}),
    ("run_at", {"delay_seconds": 5, "run_at": "2030-01-01T00:00:00Z"}),
    ("ttl_seconds", {"ttl_seconds": 0}),
    ("ttl_seconds", {"ttl_seconds": -5}),
    ("ttl_seconds", {"ttl_seconds": False}),
    ("idempotency_key", {"idempotency_key": ""}),
    ("idempotency_key", {"idempotency_key": "k" * 201}),
    ("idempotency_key", {"idempotency_key": 7}),
]


@pytest.mark.parametrize(("field", "fields"), BAD_FIELDS, ids=[repr(c[1]) for c in BAD_FIELDS])
async def test_enqueue_bad_field_is_422_naming_it_and_stores_nothing(gw, runtime_id, field, fields):
    resp = await req(gw, "POST", f"/v1/runtimes/{runtime_id}/tasks", {"payload": 1, **fields})
    assert_problem(resp, 422, "validation_failed", field)
    assert await all_tasks(gw, runtime_id) == []


async def test_enqueue_without_payload_is_422(gw, runtime_id):
    resp = await req(gw, "POST", f"/v1/runtimes/{runtime_id}/tasks", {"priority": 3})
    assert_problem(resp, 422, "validation_failed", "payload")
    resp = await req(gw, "POST", f"/v1/runtimes/{runtime_id}/tasks", raw=b"")
    assert_problem(resp, 422, "validation_failed", "payload")
    assert await all_tasks(gw, runtime_id) == []


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b'[{"payload": 1}]', b'"payload"', b"7"])
async def test_enqueue_body_not_a_json_object_is_400(gw, runtime_id, raw):
    resp = await req(gw, "POST", f"/v1/runtimes/{runtime_id}/tasks", raw=raw)
    assert_problem(resp, 400, "bad_request")
    assert await all_tasks(gw, runtime_id) == []


async def test_payload_over_limit_is_413(small_gw, runtime_id):
    path = f"/v1/runtimes/{runtime_id}/tasks"
    # "x" * 998 serializes to exactly 1000 bytes: the limit itself is allowed.
    ok = await enqueue(small_gw, runtime_id, "x" * 998)
    resp = await req(small_gw, "POST", path, {"payload": "x" * 999})
    assert_problem(resp, 413, "payload_too_large", "payload")
    resp = await req(small_gw, "POST", path, {"payload": {"k": ["é" * 600]}})  # bytes, not chars
    assert_problem(resp, 413, "payload_too_large", "payload")
    assert [t["id"] for t in await all_tasks(small_gw, runtime_id)] == [ok["id"]]


async def test_body_over_limit_is_413(small_gw, runtime_id):
    path = f"/v1/runtimes/{runtime_id}/tasks"
    # The payload is small; the body is padded past 4096 bytes with another field.
    body = {"payload": 1, "padding": " " * 5000}
    resp = await req(small_gw, "POST", path, body)
    assert_problem(resp, 413, "payload_too_large")

    async def chunks():  # no Content-Length: the limit must hold while streaming too
        yield b'{"payload": 1, "padding": "'
        for _ in range(10):
            yield b" " * 1000
        yield b'"}'

    resp = await req(small_gw, "POST", path, raw=chunks())
    assert_problem(resp, 413, "payload_too_large")
    assert await all_tasks(small_gw, runtime_id) == []


@pytest.mark.parametrize("bad", ["-bad", "a" * 129, ".dot", "sp%20ace", "%C3%A9t%C3%A9"])
async def test_bad_runtime_id_is_422(gw, bad):
    resp = await req(gw, "POST", f"/v1/runtimes/{bad}/tasks", {"payload": 1})
    assert_problem(resp, 422, "validation_failed", "runtime_id")
    for method, path, body in (
        ("POST", f"/v1/runtimes/{bad}/claim", {"worker_id": "w"}),
        ("POST", f"/v1/runtimes/{bad}/tasks:batch", {"tasks": [{"payload": 1}]}),
        ("GET", f"/v1/runtimes/{bad}/tasks", None),
        ("GET", f"/v1/runtimes/{bad}/stats", None),
    ):
        resp = await req(gw, method, path, body) if body else await req(gw, method, path)
        assert_problem(resp, 422, "validation_failed", "runtime_id")


async def test_runtime_id_with_trailing_newline_is_422(gw, runtime_id):
    # Python's `$` also matches before a final newline: the id must match in full.
    resp = await req(gw, "POST", f"/v1/runtimes/{runtime_id}%0A/tasks", {"payload": 1})
    assert_problem(resp, 422, "validation_failed", "runtime_id")


async def test_longest_runtime_id_is_accepted(gw):
    rt = "R" + "a.b_c:d-" * 15 + "x" * 7  # 128 characters
    assert len(rt) == 128
    task = await enqueue(gw, rt, "long")
    assert task["runtime_id"] == rt
    assert (await claim_one(gw, rt))["id"] == task["id"]


@pytest.mark.parametrize(
    "auth", [None, "wrong-token", ""], ids=["no-header", "wrong-token", "empty-token"]
)
async def test_enqueue_without_valid_token_is_401_and_stores_nothing(gw, runtime_id, auth):
    resp = await req(gw, "POST", f"/v1/runtimes/{runtime_id}/tasks", {"payload": 1}, auth=auth)
    assert_problem(resp, 401, "unauthorized")
    resp = await req(
        gw,
        "POST",
        f"/v1/runtimes/{runtime_id}/tasks",
        {"payload": 1},
        auth=None,
        headers={"Authorization": "Basic dGVzdDp0ZXN0"},
    )
    assert_problem(resp, 401, "unauthorized")
    assert await all_tasks(gw, runtime_id) == []


async def test_every_api_route_needs_the_token(gw, runtime_id):
    task = await enqueue(gw, runtime_id, 1)
    for method, path in (
        ("POST", f"/v1/runtimes/{runtime_id}/tasks:batch"),
        ("POST", f"/v1/runtimes/{runtime_id}/claim"),
        ("GET", f"/v1/runtimes/{runtime_id}/tasks"),
        ("GET", f"/v1/runtimes/{runtime_id}/stats"),
        ("GET", f"/v1/tasks/{task['id']}"),
        ("POST", f"/v1/tasks/{task['id']}/heartbeat"),
        ("POST", f"/v1/tasks/{task['id']}/complete"),
        ("POST", f"/v1/tasks/{task['id']}/fail"),
        ("POST", f"/v1/tasks/{task['id']}/release"),
        ("POST", f"/v1/tasks/{task['id']}/cancel"),
        ("POST", f"/v1/tasks/{task['id']}/retry"),
    ):
        resp = await req(gw, method, path, auth="nope")
        assert_problem(resp, 401, "unauthorized")
    assert (await get_task(gw, task["id"]))["status"] == "queued"


# -- delays and TTLs ----------------------------------------------------------------


async def test_delay_seconds_holds_task_until_due(gw, runtime_id):
    task = await enqueue(gw, runtime_id, "later", delay_seconds=1)
    assert task["status"] == "queued"
    run_at = datetime.fromisoformat(task["run_at"])
    created = datetime.fromisoformat(task["created_at"])
    # One clock (Postgres's) for both: exact to within the statement's own duration.
    assert timedelta(seconds=0.99) <= run_at - created <= timedelta(seconds=1.01), task
    assert await claim(gw, runtime_id, wait_seconds=0) == []
    assert await claim(gw, runtime_id, wait_seconds=0.2) == []
    started = time.monotonic()
    got = await claim(gw, runtime_id, wait_seconds=5)  # parked until it comes due
    waited = time.monotonic() - started
    assert [t["id"] for t in got] == [task["id"]]
    assert waited < 2.5, waited
    assert now_rfc3339() >= task["run_at"]


@pytest.mark.parametrize("batch", [False, True], ids=["single", "batch"])
async def test_delay_and_ttl_count_on_the_database_clock(gw, runtime_id, batch):
    fields: dict[str, Any] = {"payload": 1, "delay_seconds": 100, "ttl_seconds": 30}
    explicit: dict[str, Any] = {"payload": 2, "run_at": "2030-01-01T00:00:00Z", "ttl_seconds": 30}
    if batch:
        resp = await req(
            gw, "POST", f"/v1/runtimes/{runtime_id}/tasks:batch", {"tasks": [fields, explicit]}
        )
        assert resp.status == 201, resp.body
        delayed, fixed = resp.body["tasks"]
    else:
        delayed = await enqueue(gw, runtime_id, **fields)
        fixed = await enqueue(gw, runtime_id, **explicit)

    def at(value: str) -> datetime:
        return datetime.fromisoformat(value)

    assert at(delayed["expires_at"]) - at(delayed["run_at"]) == timedelta(seconds=30)
    gap = at(delayed["run_at"]) - at(delayed["created_at"])
    assert timedelta(seconds=99.99) <= gap <= timedelta(seconds=100.01), delayed
    assert fixed["run_at"] == "2030-01-01T00:00:00.000000Z"
    assert fixed["expires_at"] == "2030-01-01T00:00:30.000000Z"


async def test_run_at_in_the_past_is_claimable_at_once(gw, runtime_id):
    past = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    task = await enqueue(gw, runtime_id, "now", run_at=past)
    assert task["run_at"] == past
    assert (await claim_one(gw, runtime_id, wait_seconds=0))["id"] == task["id"]


async def test_run_at_with_offset_is_stored_in_utc_and_respected(gw, runtime_id):
    due = datetime.now(UTC) + timedelta(seconds=30)
    local = due.astimezone(UTC).replace(tzinfo=None).isoformat() + "+00:00"
    shifted = (due + timedelta(hours=2)).replace(tzinfo=None).isoformat() + "+02:00"
    a = await enqueue(gw, runtime_id, "a", run_at=local)
    b = await enqueue(gw, runtime_id, "b", run_at=shifted)
    expected = due.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert a["run_at"] == expected and b["run_at"] == expected, (a, b)
    assert await claim(gw, runtime_id) == []


async def test_ttl_expired_task_is_never_handed_out_even_before_the_janitor(gw, runtime_id):
    task = await enqueue(gw, runtime_id, "short-lived", ttl_seconds=1)
    created = datetime.fromisoformat(task["created_at"])
    expires = datetime.fromisoformat(task["expires_at"])
    assert TIME_RE.match(task["expires_at"])
    assert timedelta(seconds=0.99) <= expires - created <= timedelta(seconds=1.01), task
    keeper = await enqueue(gw, runtime_id, "no ttl", priority=0)
    await asyncio.sleep(max(0.0, (expires - datetime.now(UTC)).total_seconds()) + 0.1)
    got = await claim(gw, runtime_id, max_tasks=5)
    assert [t["id"] for t in got] == [keeper["id"]]
    assert await claim(gw, runtime_id, wait_seconds=0.3) == []
    # Only now does a janitor pass run; it finds the task still unmarked.
    report = await gw.gateway.janitor.run_once()
    assert report.expired >= 1, report
    assert (await get_task(gw, task["id"]))["status"] == "expired"
    assert await claim(gw, runtime_id) == []


# -- values the database cannot hold ----------------------------------------------------


async def test_run_at_before_1970_is_422(gw, runtime_id):
    resp = await req(
        gw,
        "POST",
        f"/v1/runtimes/{runtime_id}/tasks",
        {"payload": 1, "run_at": "0999-06-01T00:00:00Z"},
    )
    assert_problem(resp, 422, "validation_failed", "run_at")


@pytest.mark.parametrize(
    "fields",
    [
        {"run_at": "0001-01-01T00:00:00+14:00"},
        {"run_at": "9999-12-31T23:59:59-14:00"},
        {"run_at": "9999-12-31T00:00:00Z", "ttl_seconds": 365 * 86400},
    ],
    ids=["year-0", "year-10000", "expiry-overflow"],
)
async def test_run_at_out_of_storable_range_is_422(gw, runtime_id, fields):
    resp = await req(gw, "POST", f"/v1/runtimes/{runtime_id}/tasks", {"payload": 1, **fields})
    body = assert_problem(resp, 422, "validation_failed")
    assert body.get("field") in ("run_at", "ttl_seconds"), body
    assert await all_tasks(gw, runtime_id) == []


@pytest.mark.parametrize(
    ("field", "fields"),
    [
        ("payload", {"payload": "a\u0000b"}),
        ("payload", {"payload": {"k\u0000": 1}}),
        ("idempotency_key", {"payload": 1, "idempotency_key": "k\u0000"}),
    ],
    ids=["payload-value", "payload-key", "idempotency-key"],
)
async def test_nul_characters_are_not_a_server_outage(gw, runtime_id, field, fields):
    resp = await req(gw, "POST", f"/v1/runtimes/{runtime_id}/tasks", fields)
    if resp.status == 201 and field == "payload":  # storing it intact is fine too
        assert resp.body["payload"] == fields["payload"]
        return
    assert_problem(resp, 422, field=field)
    assert await all_tasks(gw, runtime_id) == []
