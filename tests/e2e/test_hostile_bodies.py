"""Bodies that become more than they were: numbers written short and answered long,
nesting past what the JSON parsers read, and keys that belong to someone else. Each
is refused with a 4xx that names it, and nothing is stored (security issue, second
probe: defects 1, 3 and 4, and repeated keys in a signed body)."""

from __future__ import annotations

import secrets
from typing import Any

import orjson
import pytest
import pytest_asyncio

from tests.support.credentials import deliver, make_secret, sign
from tests.support.databases import rows
from tests.support.gateways import TOKEN, gateway
from tests.support.http import get_task, req
from tests.support.lifecycle import all_tasks, assert_problem, claim, claim_one, enqueue

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.integration]

# Small enough that a test's bodies stay small, and far below the payload limit (1 MiB),
# so that what is refused is the request as a whole.
BODY_LIMIT = 40_000
# 1e300 is sent as 5 characters and answered as 301 digits; 1e99 takes orjson's own
# path (a double holds it) and is answered as 100 digits.
BIG = "1e300"
BIG_WRITTEN = 301
# What a task's answer carries besides its payload: id, times, status...
TASK_OVERHEAD_BYTES = 400
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def small(database_url, redis_url):
    """A gateway whose body limit is BODY_LIMIT."""
    async with gateway(database_url, redis_url, max_body_bytes=BODY_LIMIT) as inst:
        yield inst


@pytest.fixture
def rt() -> str:
    return "hb-" + secrets.token_hex(4)


def numbers(count: int, number: str = BIG) -> str:
    return "[" + ",".join([number] * count) + "]"


def assert_body_too_large(resp: Any) -> None:
    assert_problem(resp, 413, "payload_too_large", field="body")
    assert "GATEWAY_MAX_BODY_BYTES" in resp.body["detail"], resp.body


# -- defect 1: a body is bounded by what it is written out as --------------------------


async def test_a_batch_whose_numbers_expand_past_the_body_limit_is_refused(small, rt):
    # Each payload fits the payload limit written out (100 x 301 digits), and the body
    # as sent is a tenth of the limit; written out, the batch is twice the limit.
    per_item = 100
    items = 2 * BODY_LIMIT // (per_item * BIG_WRITTEN) + 1
    raw = orjson.dumps({"tasks": [{"payload": orjson.Fragment(numbers(per_item))}] * items})
    assert len(raw) < BODY_LIMIT / 5
    resp = await req(small, "POST", f"/v1/runtimes/{rt}/tasks:batch", raw=raw)
    assert_body_too_large(resp)
    assert await all_tasks(small, rt) == []


async def test_numbers_a_double_holds_count_written_out_too(small, rt):
    # orjson reads 1e99 itself (no exact path): 4 characters answered as 100.
    count = BODY_LIMIT // 100 + 1
    raw = b'{"payload": %s}' % numbers(count, "1e99").encode()
    resp = await req(small, "POST", f"/v1/runtimes/{rt}/tasks", raw=raw)
    assert_body_too_large(resp)
    assert await all_tasks(small, rt) == []


async def test_numbers_stored_longer_than_sent_count_too(small, rt):
    # 9e15 is read as a double and stored as 9000000000000000.0: 18 characters for 4.
    raw = orjson.dumps({"tasks": [{"payload": orjson.Fragment(numbers(100, "9e15"))}] * 25})
    assert len(raw) < BODY_LIMIT / 3
    resp = await req(small, "POST", f"/v1/runtimes/{rt}/tasks:batch", raw=raw)
    assert_body_too_large(resp)
    assert await all_tasks(small, rt) == []


async def test_a_batch_that_fits_written_out_is_answered_within_the_limit(small, rt):
    items, per_item = 10, 10
    raw = orjson.dumps({"tasks": [{"payload": orjson.Fragment(numbers(per_item))}] * items})
    async with small.http.post(
        small.url + f"/v1/runtimes/{rt}/tasks:batch", data=raw, headers=AUTH
    ) as resp:
        assert resp.status == 201, await resp.text()
        answer = await resp.read()
    # Every number came back written out in full, and the answer within the body limit
    # but for what each task carries besides its payload.
    assert answer.count(b"1" + b"0" * 300) == items * per_item
    assert len(answer) <= BODY_LIMIT + items * TASK_OVERHEAD_BYTES


async def test_a_single_enqueue_is_bounded_by_the_body_limit_written_out(small, rt):
    raw = b'{"payload": %s}' % numbers(BODY_LIMIT // BIG_WRITTEN + 1).encode()
    resp = await req(small, "POST", f"/v1/runtimes/{rt}/tasks", raw=raw)
    assert_body_too_large(resp)
    assert await all_tasks(small, rt) == []


async def test_a_result_that_expands_past_the_limit_is_refused_and_the_lease_kept(small, rt):
    await enqueue(small, rt, "job")
    task = await claim_one(small, rt)
    result = numbers(BODY_LIMIT // BIG_WRITTEN + 1)
    raw = b'{"lease_id": "%s", "result": %s}' % (task["lease_id"].encode(), result.encode())
    resp = await req(small, "POST", f"/v1/tasks/{task['id']}/complete", raw=raw)
    assert_body_too_large(resp)
    assert (await get_task(small, task["id"]))["status"] == "claimed"


async def test_a_batch_of_results_that_expands_past_the_limit_is_refused(small, rt):
    for n in range(3):
        await enqueue(small, rt, n)
    tasks = await claim(small, rt, max_tasks=3)
    per_item = BODY_LIMIT // (3 * BIG_WRITTEN) + 1
    items = [
        {"id": t["id"], "lease_id": t["lease_id"], "result": orjson.Fragment(numbers(per_item))}
        for t in tasks
    ]
    resp = await req(small, "POST", "/v1/tasks:complete", raw=orjson.dumps({"tasks": items}))
    assert_body_too_large(resp)
    assert {(await get_task(small, t["id"]))["status"] for t in tasks} == {"claimed"}


async def test_a_delivery_that_expands_past_the_limit_is_refused(small, rt):
    secret = (await make_secret(small, [rt]))["secret"]
    raw = numbers(BODY_LIMIT // BIG_WRITTEN + 1).encode()
    resp = await deliver(small, rt, raw, sign(secret, raw, "msg_big"))
    assert_body_too_large(resp)
    assert await all_tasks(small, rt) == []


# -- defect 4: nesting past the parsers' reach gets the documented answer -------------


def deep(levels: int) -> str:
    return "[" * levels + "1" + "]" * levels


DEPTHS = [1023, 1024, 1025, 5000, 200_000]


@pytest.mark.parametrize("levels", DEPTHS)
async def test_a_payload_nested_past_the_parsers_is_a_422_naming_it(gw, rt, levels):
    for raw in (f'{{"payload": {deep(levels)}}}', f'{{"payload": [{deep(levels)}, 1e400]}}'):
        resp = await req(gw, "POST", f"/v1/runtimes/{rt}/tasks", raw=raw.encode())
        assert_problem(resp, 422, "validation_failed", field="payload")
        assert "GATEWAY_MAX_JSON_DEPTH" in resp.body["detail"]
    assert await all_tasks(gw, rt) == []


@pytest.mark.parametrize("levels", DEPTHS)
async def test_a_batch_item_nested_past_the_parsers_names_its_index(gw, rt, levels):
    raw = f'{{"tasks": [{{"payload": 1}}, {{"payload": {deep(levels)}}}]}}'.encode()
    resp = await req(gw, "POST", f"/v1/runtimes/{rt}/tasks:batch", raw=raw)
    assert_problem(resp, 422, "validation_failed", field="tasks[1].payload")
    assert resp.body["index"] == 1
    assert await all_tasks(gw, rt) == []


@pytest.mark.parametrize("levels", [1024, 5000])
async def test_results_nested_past_the_parsers_are_a_422_naming_them(gw, rt, levels):
    await enqueue(gw, rt, 1)
    task = await claim_one(gw, rt)
    single = f'{{"lease_id": "{task["lease_id"]}", "result": {deep(levels)}}}'
    resp = await req(gw, "POST", f"/v1/tasks/{task['id']}/complete", raw=single.encode())
    assert_problem(resp, 422, "validation_failed", field="result")
    item = f'{{"id": "{task["id"]}", "lease_id": "{task["lease_id"]}", "result": {deep(levels)}}}'
    many = await req(gw, "POST", "/v1/tasks:complete", raw=f'{{"tasks": [{item}]}}'.encode())
    assert_problem(many, 422, "validation_failed", field="tasks[0].result")
    assert (await get_task(gw, task["id"]))["status"] == "claimed"


@pytest.mark.parametrize("levels", [1024, 5000])
async def test_a_delivery_nested_past_the_parsers_is_a_422_naming_the_payload(gw, rt, levels):
    secret = (await make_secret(gw, [rt]))["secret"]
    raw = deep(levels).encode()
    resp = await deliver(gw, rt, raw, sign(secret, raw))
    assert_problem(resp, 422, "validation_failed", field="payload")
    assert await all_tasks(gw, rt) == []


async def test_what_is_not_json_before_the_deep_part_is_still_a_400(gw, rt):
    raw = b'{"payload": 1 2, "x": ' + deep(2000).encode() + b"}"
    resp = await req(gw, "POST", f"/v1/runtimes/{rt}/tasks", raw=raw)
    assert_problem(resp, 400, "bad_request")


# -- defect 3: a producer cannot take a webhook delivery's key ------------------------


async def test_a_producer_cannot_take_a_deliverys_idempotency_key(gw, rt):
    secret = (await make_secret(gw, [rt]))["secret"]
    path = f"/v1/runtimes/{rt}/tasks"
    squat = {"payload": 1, "idempotency_key": "webhook:msg_1"}
    refusals = [
        await req(gw, "POST", path, squat),
        await req(gw, "POST", path, {"payload": 1}, headers={"Idempotency-Key": "webhook:msg_1"}),
        await req(gw, "POST", path + ":batch", {"tasks": [{"payload": 0}, squat]}),
    ]
    for index, resp in enumerate(refusals):
        field = "tasks[1].idempotency_key" if index == 2 else "idempotency_key"
        assert_problem(resp, 422, "validation_failed", field=field)
        assert "webhook:" in resp.body["detail"]
    assert await all_tasks(gw, rt) == []
    raw = orjson.dumps({"event": "push"})
    delivered = await deliver(gw, rt, raw, sign(secret, raw, "msg_1"))
    assert delivered.status == 201, delivered.body
    stored = await rows(gw, "SELECT idempotency_key FROM tasks WHERE runtime_id = $1", rt)
    assert stored == [{"idempotency_key": "webhook:msg_1"}]


async def test_keys_that_only_look_alike_are_a_producers_to_use(gw, rt):
    for key in ("Webhook:msg_1", "webhooks:msg_1", "msg_1:webhook:"):
        task = await enqueue(gw, rt, 1, idempotency_key=key)
        assert task["status"] == "queued"


# -- repeated keys in a signed body ----------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [b'{"a": 1, "a": 2}', b'{"x": [{"b": {"a": 1, "a": 1}}]}', b'[{"k": 1e400, "k": "1"}]'],
)
async def test_a_delivery_that_repeats_a_key_is_refused(gw, rt, raw):
    secret = (await make_secret(gw, [rt]))["secret"]
    resp = await deliver(gw, rt, raw, sign(secret, raw))
    assert_problem(resp, 422, "validation_failed", field="payload")
    assert "twice" in resp.body["detail"]
    assert await all_tasks(gw, rt) == []


async def test_a_delivery_with_the_same_key_in_different_objects_is_accepted(gw, rt):
    secret = (await make_secret(gw, [rt]))["secret"]
    raw = b'{"a": {"a": 1}, "b": [{"a": 2}, {"a": 3}]}'
    resp = await deliver(gw, rt, raw, sign(secret, raw))
    assert resp.status == 201, resp.body
    assert resp.body["payload"] == orjson.loads(raw)
