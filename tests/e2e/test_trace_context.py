"""A task's trace context end to end through a real gateway: sent as W3C headers (or a
batch item's `trace`), stored with the task through every enqueue path (one task, a
sync match to a parked poll, every batch statement, a signed webhook), and given back
in the enqueue's answer, a read, a listing and a claim; never mixed between tasks;
malformed, ignored and never refused; and no part of an idempotent request's
identity."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import pytest

from tests.support.credentials import deliver, make_secret
from tests.support.http import req
from tests.support.lifecycle import all_tasks, claim

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.integration]

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
OTHER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TRACED = {"traceparent": PARENT, "tracestate": "congo=t61rcWkgMzE"}


def parent(n: int) -> str:
    """A distinct well-formed traceparent per n."""
    return f"00-{n + 1:032x}-{n + 1:016x}-01"


async def read(gw: Any, task_id: str) -> dict[str, Any]:
    got = await req(gw, "GET", f"/v1/tasks/{task_id}")
    assert got.status == 200, got.body
    return dict(got.body)


async def test_a_traced_enqueue_carries_its_context_everywhere(gw, runtime_id):
    rt = runtime_id
    made = await req(gw, "POST", f"/v1/runtimes/{rt}/tasks", {"payload": 1}, headers=TRACED)
    assert made.status == 201, made.body
    assert made.body["trace"] == TRACED
    assert (await read(gw, made.body["id"]))["trace"] == TRACED
    assert [t.get("trace") for t in await all_tasks(gw, rt)] == [TRACED]
    [claimed] = await claim(gw, rt)
    assert claimed["id"] == made.body["id"] and claimed["trace"] == TRACED


@pytest.mark.parametrize(
    "headers",
    [
        {"traceparent": "garbage", "tracestate": "a=1"},
        {"traceparent": "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
        {"tracestate": "a=1"},
    ],
)
async def test_a_malformed_context_is_ignored_not_refused(gw, runtime_id, headers):
    made = await req(
        gw, "POST", f"/v1/runtimes/{runtime_id}/tasks", {"payload": 1}, headers=headers
    )
    assert made.status == 201, made.body
    assert "trace" not in made.body and "trace" not in await read(gw, made.body["id"])
    batch = await req(
        gw,
        "POST",
        f"/v1/runtimes/{runtime_id}/tasks:batch",
        {"tasks": [{"payload": 2, "trace": {"traceparent": "nope"}}, {"payload": 3, "trace": 7}]},
        headers=headers,
    )
    assert batch.status == 201, batch.body
    assert all("trace" not in t for t in batch.body["tasks"])


async def test_a_replay_with_another_context_is_still_a_replay(gw, runtime_id):
    path = f"/v1/runtimes/{runtime_id}/tasks"
    body = {"payload": {"n": 1}, "idempotency_key": "k1"}
    first = await req(gw, "POST", path, body, headers={"traceparent": PARENT})
    again = await req(gw, "POST", path, body, headers={"traceparent": OTHER})
    bare = await req(gw, "POST", path, body)
    assert (first.status, again.status, bare.status) == (201, 200, 200)
    assert again.body["id"] == first.body["id"] == bare.body["id"]
    assert again.body["trace"] == {"traceparent": PARENT}  # the stored one


@pytest.mark.parametrize("keyed", [False, True], ids=["keyless", "keyed"])
@pytest.mark.parametrize("minimal", [False, True], ids=["whole", "minimal"])
async def test_a_batch_takes_the_headers_and_an_items_own_context_wins(
    gw, runtime_id, keyed, minimal
):
    items: list[dict[str, Any]] = [
        {"payload": 0},
        {"payload": 1, "trace": {"traceparent": OTHER, "tracestate": "b=2"}},
        {"payload": 2, "trace": {"traceparent": "broken"}},  # ignored: the headers'
        {"payload": 3, "delay_seconds": 0.001},
    ]
    if keyed:
        items = [{**item, "idempotency_key": f"k{n}"} for n, item in enumerate(items)]
    headers = {"traceparent": PARENT, **({"Prefer": "return=minimal"} if minimal else {})}
    made = await req(
        gw, "POST", f"/v1/runtimes/{runtime_id}/tasks:batch", {"tasks": items}, headers=headers
    )
    assert made.status == 201, made.body
    stored = [await read(gw, t["id"]) for t in made.body["tasks"]]
    want = [
        {"traceparent": PARENT},
        {"traceparent": OTHER, "tracestate": "b=2"},
        {"traceparent": PARENT},
        {"traceparent": PARENT},
    ]
    assert [t.get("trace") for t in stored] == want
    if not minimal:
        assert [t.get("trace") for t in made.body["tasks"]] == want


async def test_a_hundred_traces_claimed_in_batches_are_never_mixed(gw, runtime_id):
    tasks = [{"payload": {"n": n}, "trace": {"traceparent": parent(n)}} for n in range(100)]
    made = await req(gw, "POST", f"/v1/runtimes/{runtime_id}/tasks:batch", {"tasks": tasks})
    assert made.status == 201, made.body
    seen: dict[int, str] = {}
    while len(seen) < 100:
        claimed = await claim(gw, runtime_id, max_tasks=7)
        assert claimed, f"{len(seen)} of 100 claimed"
        for task in claimed:
            seen[task["payload"]["n"]] = task["trace"]["traceparent"]
    assert seen == {n: parent(n) for n in range(100)}


async def test_a_task_handed_to_a_parked_poll_carries_its_context(gw, runtime_id):
    """A sync match: the enqueue writes the task already leased to the parked poll."""
    parked = asyncio.create_task(claim(gw, runtime_id, wait_seconds=10))
    await asyncio.sleep(0.3)
    made = await req(gw, "POST", f"/v1/runtimes/{runtime_id}/tasks", {"payload": 1}, headers=TRACED)
    assert made.status == 201 and made.body["trace"] == TRACED
    [task] = await parked
    assert task["id"] == made.body["id"] and task["trace"] == TRACED


async def test_a_signed_webhook_delivery_carries_its_context(gw):
    rt = f"hk-trace-{secrets.token_hex(3)}"
    secret = (await make_secret(gw, [rt]))["secret"]
    made = await deliver(gw, rt, {"event": 1}, headers=TRACED, secret=secret)
    assert made.status == 201, made.body
    assert made.body["trace"] == TRACED
