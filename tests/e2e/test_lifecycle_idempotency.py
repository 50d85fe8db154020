"""Idempotency keys and batch enqueue through the HTTP API (design sections 4 and 5)."""

from __future__ import annotations

import asyncio
import secrets

import pytest

from tests.support.gateways import gateway
from tests.support.http import req, req_past_busy
from tests.support.lifecycle import all_tasks, assert_problem, claim, claim_one, lease_op

pytestmark = pytest.mark.asyncio(loop_scope="module")


def tasks_path(rt: str) -> str:
    return f"/v1/runtimes/{rt}/tasks"


def batch_path(rt: str) -> str:
    return f"/v1/runtimes/{rt}/tasks:batch"


def replayed(resp) -> bool:
    return resp.headers.get("Idempotent-Replayed") == "true"


# -- single enqueue -------------------------------------------------------------------


async def test_same_key_same_request_replays_the_task(gw, runtime_id):
    body = {"payload": {"n": 1}, "priority": 7, "idempotency_key": "k-1"}
    first = await req(gw, "POST", tasks_path(runtime_id), body)
    assert first.status == 201, first.body
    assert not replayed(first)
    again = await req(gw, "POST", tasks_path(runtime_id), body)
    assert again.status == 200, again.body
    assert replayed(again)
    assert again.body["id"] == first.body["id"]
    assert again.body == first.body
    assert [t["id"] for t in await all_tasks(gw, runtime_id)] == [first.body["id"]]


async def test_replay_after_claim_and_complete_returns_the_same_task(gw, runtime_id):
    body = {"payload": "once", "idempotency_key": "deliver-once"}
    first = await req(gw, "POST", tasks_path(runtime_id), body)
    assert first.status == 201
    task = await claim_one(gw, runtime_id)
    again = await req(gw, "POST", tasks_path(runtime_id), body)
    assert (again.status, replayed(again), again.body["id"]) == (200, True, first.body["id"])
    assert again.body["status"] == "claimed"
    resp = await lease_op(gw, "complete", task, result="done")
    assert resp.status == 200, resp.body
    again = await req(gw, "POST", tasks_path(runtime_id), body)
    assert (again.status, replayed(again), again.body["id"]) == (200, True, first.body["id"])
    assert again.body["status"] == "completed"
    assert await claim(gw, runtime_id) == []  # the replay queued nothing new
    assert len(await all_tasks(gw, runtime_id)) == 1


async def test_replay_spelling_out_defaults_is_the_same_request(gw, runtime_id):
    first = await req(gw, "POST", tasks_path(runtime_id), {"payload": 1, "idempotency_key": "d"})
    assert first.status == 201
    again = await req(
        gw,
        "POST",
        tasks_path(runtime_id),
        {"payload": 1, "idempotency_key": "d", "priority": 50, "max_attempts": 5},
    )
    assert (again.status, replayed(again), again.body["id"]) == (200, True, first.body["id"])


@pytest.mark.parametrize(
    "changed",
    [{"payload": {"n": 2}}, {"priority": 8}, {"max_attempts": 2}, {"ttl_seconds": 60}],
    ids=["payload", "priority", "max_attempts", "ttl"],
)
async def test_same_key_different_request_is_422_key_reused(gw, runtime_id, changed):
    body = {"payload": {"n": 1}, "priority": 7, "idempotency_key": "k-2"}
    first = await req(gw, "POST", tasks_path(runtime_id), body)
    assert first.status == 201
    resp = await req(gw, "POST", tasks_path(runtime_id), {**body, **changed})
    assert_problem(resp, 422, "idempotency_key_reused")
    tasks = await all_tasks(gw, runtime_id)
    assert [t["id"] for t in tasks] == [first.body["id"]]
    assert tasks[0]["payload"] == {"n": 1} and tasks[0]["priority"] == 7


async def test_header_and_body_key_must_match(gw, runtime_id):
    resp = await req(
        gw,
        "POST",
        tasks_path(runtime_id),
        {"payload": 1, "idempotency_key": "body-key"},
        headers={"Idempotency-Key": "header-key"},
    )
    assert_problem(resp, 400, "bad_request")
    assert await all_tasks(gw, runtime_id) == []


async def test_key_via_header(gw, runtime_id):
    headers = {"Idempotency-Key": "hdr-1"}
    first = await req(gw, "POST", tasks_path(runtime_id), {"payload": 1}, headers=headers)
    assert (first.status, replayed(first)) == (201, False)
    again = await req(gw, "POST", tasks_path(runtime_id), {"payload": 1}, headers=headers)
    assert (again.status, replayed(again), again.body["id"]) == (200, True, first.body["id"])
    # The same key in the body names the same task; in both places it must match.
    body_key = await req(
        gw, "POST", tasks_path(runtime_id), {"payload": 1, "idempotency_key": "hdr-1"}
    )
    assert (body_key.status, body_key.body["id"]) == (200, first.body["id"])
    both = await req(
        gw,
        "POST",
        tasks_path(runtime_id),
        {"payload": 1, "idempotency_key": "hdr-1"},
        headers=headers,
    )
    assert (both.status, both.body["id"]) == (200, first.body["id"])
    reused = await req(gw, "POST", tasks_path(runtime_id), {"payload": 2}, headers=headers)
    assert_problem(reused, 422, "idempotency_key_reused")
    too_long = await req(
        gw, "POST", tasks_path(runtime_id), {"payload": 1}, headers={"Idempotency-Key": "k" * 201}
    )
    assert_problem(too_long, 422, "validation_failed", "idempotency_key")
    assert len(await all_tasks(gw, runtime_id)) == 1


async def test_keys_are_per_runtime(gw, runtime_id):
    other = runtime_id + "-other"
    body = {"payload": 1, "idempotency_key": "shared"}
    a = await req(gw, "POST", tasks_path(runtime_id), body)
    b = await req(gw, "POST", tasks_path(other), body)
    assert (a.status, b.status) == (201, 201), (a.body, b.body)
    assert a.body["id"] != b.body["id"]
    assert b.body["runtime_id"] == other
    # A different request under the same key is fine on another runtime too.
    c = await req(gw, "POST", tasks_path(other + "-2"), {"payload": 2, "idempotency_key": "shared"})
    assert c.status == 201, c.body
    assert [t["id"] for t in await claim(gw, runtime_id, max_tasks=5)] == [a.body["id"]]


async def test_concurrent_first_requests_with_one_key_make_one_task(gw, runtime_id):
    body = {"payload": {"race": True}, "idempotency_key": "race-" + secrets.token_hex(4)}
    # Thirty at once on one key wait on each other's row: a refusal is sent again with
    # the same key.
    answers = await asyncio.gather(
        *(req_past_busy(gw, "POST", tasks_path(runtime_id), body) for _ in range(30))
    )
    statuses = sorted(a.status for a in answers)
    assert statuses == [200] * 29 + [201], [(a.status, a.body) for a in answers]
    assert all(replayed(a) for a in answers if a.status == 200)
    assert len({a.body["id"] for a in answers}) == 1
    tasks = await all_tasks(gw, runtime_id)
    assert [t["id"] for t in tasks] == [answers[0].body["id"]]


# -- batch ----------------------------------------------------------------------------


async def test_batch_creates_tasks_in_request_order_and_claims_are_fifo(gw, runtime_id):
    items = [{"payload": i} for i in range(300)]
    resp = await req(gw, "POST", batch_path(runtime_id), {"tasks": items})
    assert resp.status == 201, resp.body
    assert not replayed(resp)
    tasks = resp.body["tasks"]
    assert [t["payload"] for t in tasks] == list(range(300))
    assert all(t["status"] == "queued" and t["runtime_id"] == runtime_id for t in tasks)
    assert len({t["id"] for t in tasks}) == 300
    listed = await all_tasks(gw, runtime_id)
    assert [t["id"] for t in listed] == [t["id"] for t in tasks]
    got = []
    while len(got) < 300:
        batch = await claim(gw, runtime_id, max_tasks=100)
        assert batch, "ran out of tasks"
        got.extend(t["payload"] for t in batch)
    assert got == list(range(300))
    assert await claim(gw, runtime_id) == []


async def test_batch_priorities_and_options(gw, runtime_id):
    items = [
        {"payload": "low", "priority": 1},
        {"payload": "high", "priority": 999, "max_attempts": 1},
        {"payload": "late", "delay_seconds": 60},
        {"payload": "mid"},
    ]
    resp = await req(gw, "POST", batch_path(runtime_id), {"tasks": items})
    assert resp.status == 201, resp.body
    assert [t["max_attempts"] for t in resp.body["tasks"]] == [5, 1, 5, 5]
    got = await claim(gw, runtime_id, max_tasks=10)
    assert [t["payload"] for t in got] == ["high", "mid", "low"]


@pytest.mark.parametrize(
    "body",
    [{"tasks": []}, {"tasks": [{"payload": i} for i in range(1001)]}, {}, {"tasks": {"a": 1}}],
    ids=["empty", "1001", "missing", "not-a-list"],
)
async def test_batch_size_out_of_range_is_422(gw, runtime_id, body):
    resp = await req(gw, "POST", batch_path(runtime_id), body)
    assert_problem(resp, 422, "validation_failed", "tasks")
    assert await all_tasks(gw, runtime_id) == []


async def test_batch_of_1000_is_accepted(gw, runtime_id):
    resp = await req(
        gw, "POST", batch_path(runtime_id), {"tasks": [{"payload": i} for i in range(1000)]}
    )
    assert resp.status == 201, resp.body
    assert len(resp.body["tasks"]) == 1000


@pytest.mark.parametrize(
    "bad",
    [
        {"priority": 5000},
        {"max_attempts": 0},
        {"run_at": "2030-01-01T00:00:00"},
        {"ttl_seconds": 0},
    ],
    ids=["priority", "max_attempts", "run_at", "ttl"],
)
async def test_batch_with_one_invalid_item_is_422_naming_it_and_stores_nothing(gw, runtime_id, bad):
    items = [{"payload": i} for i in range(6)]
    items[3] = {**items[3], **bad}
    resp = await req(gw, "POST", batch_path(runtime_id), {"tasks": items})
    body = assert_problem(resp, 422, "validation_failed")
    named = str(body.get("field", "")) + " " + body["detail"]
    assert "tasks[3]" in named, body
    assert next(iter(bad)) in named, body
    assert await all_tasks(gw, runtime_id) == []


async def test_batch_item_without_payload_or_not_an_object_is_422(gw, runtime_id):
    for items, index in (
        ([{"payload": 1}, {"priority": 3}], 1),
        ([{"payload": 1}, {"payload": 2}, "text"], 2),
    ):
        resp = await req(gw, "POST", batch_path(runtime_id), {"tasks": items})
        body = assert_problem(resp, 422, "validation_failed")
        assert f"tasks[{index}]" in str(body.get("field", "")) + body["detail"], body
    assert await all_tasks(gw, runtime_id) == []


async def test_batch_item_over_payload_limit_is_413(database_url, redis_url):
    rt = "rt-" + secrets.token_hex(6)
    async with gateway(database_url, redis_url, max_payload_bytes=1000) as small:
        items = [{"payload": "ok"}, {"payload": "x" * 2000}]
        resp = await req(small, "POST", batch_path(rt), {"tasks": items})
        body = assert_problem(resp, 413, "payload_too_large")
        assert "tasks[1]" in str(body.get("field", "")) + body["detail"], body
        assert await all_tasks(small, rt) == []


async def test_batch_body_not_json_is_400(gw, runtime_id):
    for raw in (b"{oops", b'[{"payload": 1}]'):
        resp = await req(gw, "POST", batch_path(runtime_id), raw=raw)
        assert_problem(resp, 400, "bad_request")
    assert await all_tasks(gw, runtime_id) == []


async def test_batch_of_replays_only_is_200_replayed(gw, runtime_id):
    items = [{"payload": i, "idempotency_key": f"b-{i}"} for i in range(5)]
    first = await req(gw, "POST", batch_path(runtime_id), {"tasks": items})
    assert (first.status, replayed(first)) == (201, False)
    again = await req(gw, "POST", batch_path(runtime_id), {"tasks": items})
    assert (again.status, replayed(again)) == (200, True), again.body
    assert [t["id"] for t in again.body["tasks"]] == [t["id"] for t in first.body["tasks"]]
    # Replays of single enqueues, in another order, are replays too.
    reordered = [items[3], items[0]]
    again = await req(gw, "POST", batch_path(runtime_id), {"tasks": reordered})
    assert (again.status, replayed(again)) == (200, True), again.body
    ids = [first.body["tasks"][3]["id"], first.body["tasks"][0]["id"]]
    assert [t["id"] for t in again.body["tasks"]] == ids
    single = await req(gw, "POST", tasks_path(runtime_id), items[2])
    assert (single.status, single.body["id"]) == (200, first.body["tasks"][2]["id"])
    assert len(await all_tasks(gw, runtime_id)) == 5


async def test_batch_mixing_new_items_and_replays_is_201(gw, runtime_id):
    single = await req(gw, "POST", tasks_path(runtime_id), {"payload": "a", "idempotency_key": "a"})
    assert single.status == 201
    items = [{"payload": "z"}, {"payload": "a", "idempotency_key": "a"}, {"payload": "y"}]
    resp = await req(gw, "POST", batch_path(runtime_id), {"tasks": items})
    assert (resp.status, replayed(resp)) == (201, False), resp.body
    assert [t["payload"] for t in resp.body["tasks"]] == ["z", "a", "y"]
    assert resp.body["tasks"][1]["id"] == single.body["id"]
    assert len(await all_tasks(gw, runtime_id)) == 3


async def test_batch_reusing_a_key_for_another_request_is_422_and_stores_nothing(gw, runtime_id):
    first = await req(gw, "POST", tasks_path(runtime_id), {"payload": "a", "idempotency_key": "a"})
    assert first.status == 201
    items = [
        {"payload": "new-0"},
        {"payload": "new-1", "idempotency_key": "fresh"},
        {"payload": "CHANGED", "idempotency_key": "a"},
        {"payload": "new-3"},
    ]
    resp = await req(gw, "POST", batch_path(runtime_id), {"tasks": items})
    body = assert_problem(resp, 422, "idempotency_key_reused")
    assert "tasks[2]" in str(body.get("field", "")) + body["detail"] or body.get("index") == 2
    tasks = await all_tasks(gw, runtime_id)
    assert [t["id"] for t in tasks] == [first.body["id"]]
    # The key the failed batch tried to take is still free.
    fresh = await req(
        gw, "POST", tasks_path(runtime_id), {"payload": 9, "idempotency_key": "fresh"}
    )
    assert fresh.status == 201, fresh.body


async def test_batch_reusing_a_key_within_itself_is_422(gw, runtime_id):
    items = [{"payload": 1, "idempotency_key": "dup"}, {"payload": 2, "idempotency_key": "dup"}]
    resp = await req(gw, "POST", batch_path(runtime_id), {"tasks": items})
    body = assert_problem(resp, 422, "idempotency_key_reused")
    assert "tasks[1]" in str(body.get("field", "")) + body["detail"] or body.get("index") == 1
    assert await all_tasks(gw, runtime_id) == []


async def test_concurrent_batches_sharing_keys_in_any_order_make_each_task_once(gw, runtime_id):
    for round_ in range(3):
        rt = f"{runtime_id}-{round_}"
        items = [{"payload": i, "idempotency_key": f"k{i}"} for i in range(1000)]
        forward, backward = await asyncio.gather(
            req(gw, "POST", batch_path(rt), {"tasks": items}),
            req(gw, "POST", batch_path(rt), {"tasks": items[::-1]}),
        )
        assert sorted([forward.status, backward.status]) in ([200, 201], [201, 201]), (
            forward.status,
            forward.body if forward.status >= 400 else "",
            backward.status,
            backward.body if backward.status >= 400 else "",
        )
        ids = [t["id"] for t in forward.body["tasks"]]
        assert [t["id"] for t in backward.body["tasks"]] == ids[::-1]
        assert len(await all_tasks(gw, rt)) == 1000
