"""Batch enqueue of 1,000 items, all or nothing, at every position in the batch: a
refusal near the end undoes the items before it, created_at keeps the request's order
over the whole batch, and concurrent batches sharing keys neither deadlock nor make a
task twice (design section 5: `tasks:batch` is all or nothing, in request order)."""

from __future__ import annotations

import asyncio
import secrets

import pytest

from tests.support.gateways import gateway
from tests.support.http import req
from tests.support.lifecycle import all_tasks, assert_problem

pytestmark = pytest.mark.asyncio(loop_scope="module")

SIZE = 1000  # the largest batch: every part of it is exercised


def batch_path(rt: str) -> str:
    return f"/v1/runtimes/{rt}/tasks:batch"


@pytest.mark.parametrize(
    ("index", "bad", "status", "field"),
    [
        (SIZE - 1, {"priority": 5000}, 422, "priority"),
        (SIZE - 3, {"delay_seconds": 5, "run_at": "2030-01-01T00:00:00Z"}, 422, "run_at"),
        (600, {"ttl_seconds": 0}, 422, "ttl_seconds"),
    ],
    ids=["last-priority", "near-end-exclusive", "middle-ttl"],
)
async def test_an_invalid_item_late_in_a_batch_stores_nothing_and_names_its_index(
    gw, runtime_id, index, bad, status, field
):
    items = [{"payload": {"i": i}} for i in range(SIZE)]
    items[index] = {"payload": {"i": index}, **bad}
    resp = await req(gw, "POST", batch_path(runtime_id), {"tasks": items})
    body = assert_problem(resp, status)
    assert body["field"] == f"tasks[{index}].{field}", body
    assert body["index"] == index and body["detail"].startswith(f"tasks[{index}]: "), body
    assert await all_tasks(gw, runtime_id) == []


async def test_a_payload_too_large_in_the_last_item_stores_nothing(database_url, redis_url):
    rt = "rt-" + secrets.token_hex(6)
    async with gateway(database_url, redis_url, max_payload_bytes=1000) as small:
        items = [{"payload": {"i": i}} for i in range(SIZE)]
        items[-1] = {"payload": "x" * 2000}
        resp = await req(small, "POST", batch_path(rt), {"tasks": items})
        body = assert_problem(resp, 413, "payload_too_large")
        assert body["field"] == f"tasks[{SIZE - 1}].payload" and body["index"] == SIZE - 1
        assert await all_tasks(small, rt) == []


async def test_a_key_reused_late_in_a_batch_undoes_every_item_before_it(gw, runtime_id):
    first = await req(
        gw, "POST", f"/v1/runtimes/{runtime_id}/tasks", {"payload": 0, "idempotency_key": "late"}
    )
    assert first.status == 201, first.body
    items: list[dict] = [{"payload": {"i": i}} for i in range(SIZE)]
    for i in range(0, SIZE, 7):
        items[i]["idempotency_key"] = f"fresh-{i}"
    items[SIZE - 2] = {"payload": "changed", "idempotency_key": "late"}
    resp = await req(gw, "POST", batch_path(runtime_id), {"tasks": items})
    body = assert_problem(resp, 422, "idempotency_key_reused")
    assert body["index"] == SIZE - 2 and body["field"] == f"tasks[{SIZE - 2}].idempotency_key"
    assert [t["id"] for t in await all_tasks(gw, runtime_id)] == [first.body["id"]]
    # The keys the refused batch tried to take are still free.
    again = await req(gw, "POST", batch_path(runtime_id), {"tasks": items[: SIZE - 2]})
    assert again.status == 201, again.body


async def test_created_at_follows_request_order_over_a_whole_batch(gw, runtime_id):
    items = [{"payload": i} for i in range(SIZE)]
    for i in range(0, SIZE, 97):  # some delayed, some with other options
        items[i] = {"payload": i, "delay_seconds": 3600, "priority": 7, "ttl_seconds": 60}
    resp = await req(gw, "POST", batch_path(runtime_id), {"tasks": items})
    assert resp.status == 201, resp.body
    answered = resp.body["tasks"]
    assert [t["payload"] for t in answered] == list(range(SIZE))
    created = [t["created_at"] for t in answered]
    assert created == sorted(created) and len(set(created)) == SIZE, "not strictly increasing"
    listed = await all_tasks(gw, runtime_id)  # oldest first: by created_at, then id
    assert [t["payload"] for t in listed] == list(range(SIZE))


async def test_concurrent_batches_sharing_keys_far_apart_neither_deadlock_nor_duplicate(
    gw, runtime_id
):
    # Each batch has keyless items and the shared keys at opposite ends, in opposite
    # orders: inserted in request order, each would hold a key the other waits for.
    for round_ in range(3):
        rt = f"{runtime_id}-{round_}"
        keyed = [{"payload": f"k{i}", "idempotency_key": f"k{i:04d}"} for i in range(SIZE // 2)]
        left = [{"payload": f"left-{i}"} for i in range(SIZE // 2)] + keyed
        right = keyed[::-1] + [{"payload": f"right-{i}"} for i in range(SIZE // 2)]
        a, b = await asyncio.gather(
            req(gw, "POST", batch_path(rt), {"tasks": left}),
            req(gw, "POST", batch_path(rt), {"tasks": right}),
        )
        assert (a.status, b.status) == (201, 201), (a.status, b.status, a.body, b.body)
        ids_a = {t["payload"]: t["id"] for t in a.body["tasks"][SIZE // 2 :]}
        ids_b = {t["payload"]: t["id"] for t in b.body["tasks"][: SIZE // 2]}
        assert ids_a == ids_b, "a shared key made two tasks"
        assert len(await all_tasks(gw, rt)) == SIZE // 2 * 3
