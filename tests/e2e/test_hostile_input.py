"""Hostile JSON can never poison the queue: nesting is capped, numbers are kept exactly,
and a task that cannot be shown is never left leased to nobody (security issue,
defects 1, 2, 3 and 11)."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import asyncpg
import orjson
import pytest
import pytest_asyncio

from gateway.api import render
from tests.support.gateways import TOKEN, Instance, gateway
from tests.support.http import get_task, req
from tests.support.lifecycle import (
    all_tasks,
    assert_problem,
    claim,
    claim_one,
    enqueue,
    lease_op,
    list_tasks,
)
from tests.support.metrics import sample

pytestmark = pytest.mark.asyncio(loop_scope="module")


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def nested_text(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


async def raw_call(inst: Instance, method: str, path: str, body: bytes | None = None) -> Any:
    """(status, body parsed with every number exact: Decimal for fractions, int for
    integers of any size)."""
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    async with inst.http.request(method, inst.url + path, data=body, headers=headers) as resp:
        text = await resp.read()
        return resp.status, json.loads(text, parse_float=Decimal)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def conn(database_url):
    """Not the shared `conn` (tests/conftest.py): one for the module, on its event loop,
    which its tests run on."""
    connection = await asyncpg.connect(database_url)
    yield connection
    await connection.close()


# -- defect 1: nesting depth ----------------------------------------------------------


async def test_payload_at_the_depth_limit_is_accepted_and_one_deeper_refused(gw, runtime_id):
    ok = await enqueue(gw, runtime_id, nested(64))
    assert ok["payload"] == nested(64)
    resp = await req(gw, "POST", f"/v1/runtimes/{runtime_id}/tasks", {"payload": nested(65)})
    assert_problem(resp, 422, "validation_failed", field="payload")
    assert len(await all_tasks(gw, runtime_id)) == 1


@pytest.mark.parametrize("depth", [252, 253, 300, 1000])
async def test_payloads_that_once_poisoned_the_queue_are_refused(gw, runtime_id, depth):
    raw = f'{{"payload": {nested_text(depth)}}}'.encode()
    resp = await req(gw, "POST", f"/v1/runtimes/{runtime_id}/tasks", raw=raw)
    assert_problem(resp, 422, "validation_failed", field="payload")
    assert await all_tasks(gw, runtime_id) == []


async def test_batch_item_too_deep_names_its_index(gw, runtime_id):
    body = {"tasks": [{"payload": 1}, {"payload": nested(65)}]}
    resp = await req(gw, "POST", f"/v1/runtimes/{runtime_id}/tasks:batch", body)
    assert_problem(resp, 422, field="tasks[1].payload")
    assert await all_tasks(gw, runtime_id) == []


async def test_result_too_deep_is_refused_and_the_lease_kept(gw, runtime_id):
    await enqueue(gw, runtime_id, "job")
    task = await claim_one(gw, runtime_id)
    raw = f'{{"lease_id": "{task["lease_id"]}", "result": {nested_text(254)}}}'.encode()
    resp = await req(gw, "POST", f"/v1/tasks/{task['id']}/complete", raw=raw)
    assert_problem(resp, 422, "validation_failed", field="result")
    assert (await get_task(gw, task["id"]))["status"] == "claimed"
    done = await lease_op(gw, "complete", task, result=nested(64))
    assert done.status == 200 and done.body["result"] == nested(64)


async def test_depth_limit_follows_the_setting(database_url, redis_url, runtime_id):
    async with gateway(database_url, redis_url, max_json_depth=3) as small:
        assert (await enqueue(small, runtime_id, nested(3)))["payload"] == nested(3)
        resp = await req(small, "POST", f"/v1/runtimes/{runtime_id}/tasks", {"payload": nested(4)})
        assert_problem(resp, 422, field="payload")
        assert "GATEWAY_MAX_JSON_DEPTH" in resp.body["detail"]


async def test_stored_deep_payloads_and_results_are_still_delivered(gw, runtime_id, conn):
    """Rows written before the cap (or by hand) deliver: the stored JSON text is sent
    as it is, never parsed again, so no depth can fail an answer."""
    before = await enqueue(gw, runtime_id, "innocent-1", priority=90)
    for depth in (253, 600):
        await conn.execute(
            "INSERT INTO tasks (runtime_id, payload, priority) VALUES ($1, $2::jsonb, 80)",
            runtime_id,
            nested_text(depth),
        )
    after = await enqueue(gw, runtime_id, "innocent-2", priority=10)
    status, body = await raw_call(
        gw, "POST", f"/v1/runtimes/{runtime_id}/claim", b'{"worker_id": "w", "max_tasks": 4}'
    )
    assert status == 200, body
    payloads = [t["payload"] for t in body["tasks"]]
    assert payloads[0] == "innocent-1" and payloads[3] == "innocent-2"
    assert payloads[1] == json.loads(nested_text(253)) or payloads[1] == nested(253)
    assert payloads[2] == nested(600)
    deep = body["tasks"][2]
    await conn.execute(
        "UPDATE tasks SET status = 'completed', result = $2::jsonb, lease_expires_at = NULL "
        "WHERE id = $1",
        deep["id"],
        nested_text(254),
    )
    status, got = await raw_call(gw, "GET", f"/v1/tasks/{deep['id']}")
    assert status == 200 and got["result"] == nested(254), got
    listing = await list_tasks(gw, runtime_id)
    assert listing.status == 200 and len(listing.body["tasks"]) == 4
    assert {before["id"], after["id"]} <= {t["id"] for t in listing.body["tasks"]}


# -- defect 1: a task that cannot be shown never strands its neighbours ----------------


def _break_rendering(monkeypatch, poison: Any) -> None:
    """Any failure to turn a row into JSON, whatever its cause."""
    real = render.task_bytes

    def broken(row):
        if orjson.loads(orjson.dumps(row.payload)) == poison:
            raise ValueError("this row cannot be written")
        return real(row)

    monkeypatch.setattr(render, "task_bytes", broken)


async def test_an_unrenderable_claimed_task_ends_dead_and_the_others_are_delivered(
    gw, runtime_id, monkeypatch
):
    innocent = [await enqueue(gw, runtime_id, f"ok-{i}") for i in range(2)]
    poison = await enqueue(gw, runtime_id, {"poison": True}, priority=100)
    metric = "gateway_tasks_unrenderable_total"
    before = sample(gw, metric)
    _break_rendering(monkeypatch, {"poison": True})

    got = await claim(gw, runtime_id, max_tasks=3)
    assert sorted(t["id"] for t in got) == sorted(t["id"] for t in innocent)
    assert sample(gw, metric) == before + 1

    # A read never fails because of it: the task is shown without its payload.
    shown = await get_task(gw, poison["id"])
    assert shown["status"] == "dead"
    assert "could not turn this task into a response" in shown["last_error"]
    assert "cannot be shown" in shown["render_error"] and shown["payload"] is None
    listing = await list_tasks(gw, runtime_id)
    assert listing.status == 200 and len(listing.body["tasks"]) == 3
    monkeypatch.undo()
    # The innocent tasks were leased once each and complete normally.
    for task in got:
        assert task["attempts"] == 1
        assert (await lease_op(gw, "complete", task)).status == 200
    assert await claim(gw, runtime_id) == []


# -- defect 2: numbers are kept exactly ------------------------------------------------

EXACT_NUMBERS = [
    "18446744073709551616",
    "-9223372036854775809",
    "123456789012345678901234567890",
    "0.10000000000000000001",
    "1.5e-400",
    "1e400",
    "3.14159265358979323846264338327950288",
    "9007199254740993",
]


async def test_every_number_comes_back_exactly(gw, runtime_id):
    items = ", ".join(EXACT_NUMBERS)
    raw = f'{{"payload": {{"n": [{items}], "s": "12345678901234567890"}}}}'.encode()
    status, created = await raw_call(gw, "POST", f"/v1/runtimes/{runtime_id}/tasks", raw)
    assert status == 201, created
    want = [Decimal(n) for n in EXACT_NUMBERS]
    assert [Decimal(n) for n in created["payload"]["n"]] == want
    assert created["payload"]["s"] == "12345678901234567890"
    status, claimed = await raw_call(
        gw, "POST", f"/v1/runtimes/{runtime_id}/claim", b'{"worker_id": "w"}'
    )
    task = claimed["tasks"][0]
    assert [Decimal(n) for n in task["payload"]["n"]] == want
    result = f'{{"lease_id": "{task["lease_id"]}", "result": {EXACT_NUMBERS[0]}}}'.encode()
    status, done = await raw_call(gw, "POST", f"/v1/tasks/{task['id']}/complete", result)
    assert status == 200 and done["result"] == 18446744073709551616, done
    status, again = await raw_call(gw, "GET", f"/v1/tasks/{task['id']}")
    assert again["result"] == 18446744073709551616


async def test_idempotency_tells_numbers_apart_beyond_double_precision(gw, runtime_id):
    path = f"/v1/runtimes/{runtime_id}/tasks"

    def body(n: str) -> bytes:
        return f'{{"payload": {n}, "idempotency_key": "k"}}'.encode()

    assert (await raw_call(gw, "POST", path, body("18446744073709551616")))[0] == 201
    assert (await raw_call(gw, "POST", path, body("18446744073709551616")))[0] == 200
    status, problem = await raw_call(gw, "POST", path, body("18446744073709551617"))
    assert status == 422 and problem["code"] == "idempotency_key_reused", problem


@pytest.mark.parametrize(
    "number",
    [
        "1e999999",
        "-1e-99999",
        "9e131071",  # 9 bytes sent, 131,072 digits answered
        "1e-99999999999999999999",
        "1e" + "9" * 5000,
        "0." + "1" * 20_000,
        "1" * 4301,
    ],
)
async def test_numbers_the_database_cannot_hold_are_refused(gw, runtime_id, number):
    raw = f'{{"payload": [{number}]}}'.encode()
    resp = await req(gw, "POST", f"/v1/runtimes/{runtime_id}/tasks", raw=raw)
    assert_problem(resp, 422, "validation_failed", field="payload")
    assert await all_tasks(gw, runtime_id) == []


async def test_the_payload_limit_counts_numbers_as_they_are_answered(
    database_url, redis_url, runtime_id
):
    """Postgres writes 1e300 out as 301 digits: the limit holds for what comes back."""
    async with gateway(database_url, redis_url, max_payload_bytes=1000) as small:
        path = f"/v1/runtimes/{runtime_id}/tasks"
        ok = await req(small, "POST", path, raw=b'{"payload": [1e300, 1e300, 1e300]}')
        assert ok.status == 201, ok.body
        answered = await small.http.get(
            small.url + f"/v1/tasks/{ok.body['id']}", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        text = await answered.read()
        assert len(orjson.dumps(orjson.loads(text)["payload"])) <= 1000
        over = await req(small, "POST", path, raw=b'{"payload": [1e300, 1e300, 1e300, 1e300]}')
        assert_problem(over, 413, "payload_too_large", field="payload")


async def test_an_oversized_number_in_a_field_is_a_422_naming_it(gw, runtime_id):
    raw = b'{"payload": 1, "priority": 18446744073709551616}'
    resp = await req(gw, "POST", f"/v1/runtimes/{runtime_id}/tasks", raw=raw)
    assert_problem(resp, 422, field="priority")


# -- defect 3: over-long numbers in the query ------------------------------------------


@pytest.mark.parametrize("limit", ["9" * 5000, "1" * 4301, "99999", "-1", "1e3"])
async def test_absurd_limits_are_422_naming_the_parameter(gw, runtime_id, limit):
    resp = await list_tasks(gw, runtime_id, f"?limit={limit}")
    assert_problem(resp, 422, "validation_failed", field="limit")


async def test_a_zero_padded_limit_is_still_a_limit(gw, runtime_id):
    await enqueue(gw, runtime_id, 1)
    resp = await list_tasks(gw, runtime_id, "?limit=" + "0" * 5000 + "1000")
    assert resp.status == 200 and len(resp.body["tasks"]) == 1


# -- defect 11: UTF-8 idempotency keys --------------------------------------------------


async def test_a_utf8_idempotency_key_header_matches_the_same_key_in_the_body(gw, runtime_id):
    key = "déploiement-ü-東京"
    path = f"/v1/runtimes/{runtime_id}/tasks"
    headers = {"Idempotency-Key": key}
    first = await req(gw, "POST", path, {"payload": 1, "idempotency_key": key}, headers=headers)
    assert first.status == 201, first.body
    again = await req(gw, "POST", path, {"payload": 1}, headers=headers)
    assert again.status == 200 and again.body["id"] == first.body["id"], again.body
    assert again.headers["Idempotent-Replayed"] == "true"
    by_body = await req(gw, "POST", path, {"payload": 1, "idempotency_key": key})
    assert by_body.status == 200 and by_body.body["id"] == first.body["id"]


async def test_an_idempotency_key_header_that_is_not_utf8_is_refused(gw, runtime_id):
    status, _ = await _raw_header_enqueue(gw, runtime_id, b"\xff\xfe-key")
    assert status == 422
    assert await all_tasks(gw, runtime_id) == []


async def _raw_header_enqueue(inst: Instance, runtime_id: str, key: bytes) -> tuple[int, bytes]:
    """aiohttp will not send arbitrary header bytes; write the request by hand."""
    import asyncio
    from urllib.parse import urlsplit

    url = urlsplit(inst.url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    body = b'{"payload": 1}'
    writer.write(
        f"POST /v1/runtimes/{runtime_id}/tasks HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n".encode()
        + b"Idempotency-Key: "
        + key
        + b"\r\n\r\n"
        + body
    )
    await writer.drain()
    answer = await reader.read()
    writer.close()
    return int(answer.split(b" ", 2)[1]), answer


async def test_the_others_are_delivered_even_when_the_bad_task_cannot_be_ended(
    gw, runtime_id, monkeypatch
):
    from gateway.errors import StoreUnavailable

    innocent = await enqueue(gw, runtime_id, "ok")
    poison = await enqueue(gw, runtime_id, {"poison": True}, priority=100)
    _break_rendering(monkeypatch, {"poison": True})

    async def bury_fails(*args: Any) -> None:
        raise StoreUnavailable("database error: gone for a moment")

    monkeypatch.setattr(gw.gateway.store, "bury", bury_fails)
    got = await claim(gw, runtime_id, max_tasks=2)
    assert [t["id"] for t in got] == [innocent["id"]]
    monkeypatch.undo()
    # Still leased under the claim that won it: the janitor takes it back when it lapses.
    assert (await get_task(gw, poison["id"]))["status"] == "claimed"


# -- listings are bounded in bytes, not only in tasks -----------------------------------


async def test_a_listing_page_stops_at_its_byte_budget_and_the_cursor_continues(
    gw, runtime_id, monkeypatch
):
    from gateway.http.handlers import producer as producer_routes

    monkeypatch.setattr(producer_routes, "LIST_PAGE_BYTES", 10_000)
    made = [await enqueue(gw, runtime_id, "x" * 3000) for _ in range(10)]
    pages, cursor = [], None
    for _ in range(20):
        query = "?limit=1000" + (f"&cursor={cursor}" if cursor else "")
        resp = await list_tasks(gw, runtime_id, query)
        assert resp.status == 200, resp.body
        pages.append([t["id"] for t in resp.body["tasks"]])
        assert len(orjson.dumps(resp.body)) < 10_000 + 4_000  # one task may cross the line
        cursor = resp.body["next_cursor"]
        if cursor is None:
            break
    assert [i for page in pages for i in page] == [t["id"] for t in made]
    assert len(pages) >= 3 and all(pages)
    # A small limit is still a limit, and a single large task still makes a page.
    monkeypatch.setattr(producer_routes, "LIST_PAGE_BYTES", 100)
    one = await list_tasks(gw, runtime_id, "?limit=5")
    assert [t["id"] for t in one.body["tasks"]] == [made[0]["id"]]
    assert one.body["next_cursor"] is not None
