"""`Prefer: return=minimal` (RFC 7240) on enqueue and batch enqueue, through HTTP, on
real Postgres and Redis: the answer holds each task's id only, in request order, and
says `Preference-Applied: return=minimal`; statuses, replays, errors, all or nothing and
the wake-up are as without it; `return=representation` (or no Prefer) answers whole
tasks, byte for byte as before."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.api.render import TASK_FIELDS
from tests.support.gateways import TOKEN, make_settings, running_gateway
from tests.support.http import Resp, get_task, req
from tests.support.lifecycle import UUID_RE, all_tasks, assert_problem, claim, enqueue
from tests.support.waiting import wait_until

pytestmark = pytest.mark.asyncio(loop_scope="module")

MINIMAL = {"Prefer": "return=minimal"}


def batch_path(rt: str) -> str:
    return f"/v1/runtimes/{rt}/tasks:batch"


def tasks_path(rt: str) -> str:
    return f"/v1/runtimes/{rt}/tasks"


def minimal_ids(resp: Resp, status: int = 201) -> list[str]:
    """The ids of a minimal batch answer, checking that it is one."""
    assert resp.status == status, (resp.status, resp.body)
    assert resp.headers.get("Preference-Applied") == "return=minimal", resp.headers
    assert set(resp.body) == {"tasks"}, resp.body
    ids = []
    for task in resp.body["tasks"]:
        assert set(task) == {"id"} and UUID_RE.match(task["id"]), task
        ids.append(task["id"])
    return ids


def minimal_id(resp: Resp, status: int = 201) -> str:
    assert resp.status == status, (resp.status, resp.body)
    assert resp.headers.get("Preference-Applied") == "return=minimal", resp.headers
    assert set(resp.body) == {"id"} and UUID_RE.match(resp.body["id"]), resp.body
    return str(resp.body["id"])


async def test_a_minimal_plain_batch_answers_the_ids_in_request_order(gw, runtime_id):
    items = [{"payload": {"i": i}} for i in range(300)]
    resp = await req(gw, "POST", batch_path(runtime_id), {"tasks": items}, headers=MINIMAL)
    ids = minimal_ids(resp)
    assert "Idempotent-Replayed" not in resp.headers
    listed = await all_tasks(gw, runtime_id)  # oldest first
    assert [t["id"] for t in listed] == ids
    assert [t["payload"] for t in listed] == [{"i": i} for i in range(300)]
    assert {t["status"] for t in listed} == {"queued"}
    assert (await get_task(gw, ids[123]))["payload"] == {"i": 123}


async def test_a_minimal_batch_with_times_and_options_answers_the_ids(gw, runtime_id):
    # Keyless, but items set times: the statement for timed batches, not the plain one.
    items: list[dict[str, Any]] = [
        {"payload": "now", "priority": 90, "max_attempts": 2},
        {"payload": "later", "delay_seconds": 3600},
        {"payload": "short", "ttl_seconds": 600},
        {"payload": "at", "run_at": "2030-01-01T00:00:00Z"},
    ]
    resp = await req(gw, "POST", batch_path(runtime_id), {"tasks": items}, headers=MINIMAL)
    ids = minimal_ids(resp)
    for task_id, item in zip(ids, items, strict=True):
        stored = await get_task(gw, task_id)
        assert stored["payload"] == item["payload"], (item, stored)
    assert (await get_task(gw, ids[0]))["priority"] == 90
    assert (await get_task(gw, ids[3]))["run_at"] == "2030-01-01T00:00:00.000000Z"


async def test_a_minimal_single_enqueue_answers_the_id(gw, runtime_id):
    resp = await req(gw, "POST", tasks_path(runtime_id), {"payload": {"n": 1}}, headers=MINIMAL)
    task_id = minimal_id(resp)
    stored = await get_task(gw, task_id)
    assert stored["payload"] == {"n": 1} and stored["status"] == "queued"
    later = await req(
        gw, "POST", tasks_path(runtime_id), {"payload": 2, "delay_seconds": 60}, headers=MINIMAL
    )
    assert (await get_task(gw, minimal_id(later)))["payload"] == 2


async def test_minimal_replays_answer_the_stored_tasks_ids(gw, runtime_id):
    first = await enqueue(gw, runtime_id, "single", idempotency_key="s")
    again = await req(
        gw,
        "POST",
        tasks_path(runtime_id),
        {"payload": "single"},
        headers={**MINIMAL, "Idempotency-Key": "s"},
    )
    assert minimal_id(again, 200) == first["id"]
    assert again.headers.get("Idempotent-Replayed") == "true"

    keyed = [{"payload": n, "idempotency_key": f"b{n}"} for n in range(5)]
    made = await req(gw, "POST", batch_path(runtime_id), {"tasks": keyed})
    assert made.status == 201, made.body
    replay = await req(gw, "POST", batch_path(runtime_id), {"tasks": keyed}, headers=MINIMAL)
    assert minimal_ids(replay, 200) == [t["id"] for t in made.body["tasks"]]
    assert replay.headers.get("Idempotent-Replayed") == "true"


async def test_a_minimal_mixed_batch_answers_new_and_replayed_ids_in_order(gw, runtime_id):
    old = await enqueue(gw, runtime_id, "old", idempotency_key="old")
    items: list[dict[str, Any]] = [
        {"payload": "first"},
        {"payload": "old", "idempotency_key": "old"},  # a replay, amid new items
        {"payload": "keyed", "idempotency_key": "new"},
        {"payload": "delayed", "delay_seconds": 3600, "idempotency_key": "later"},
        {"payload": "last"},
    ]
    resp = await req(gw, "POST", batch_path(runtime_id), {"tasks": items}, headers=MINIMAL)
    ids = minimal_ids(resp)  # 201: not every item was a replay
    assert "Idempotent-Replayed" not in resp.headers
    assert ids[1] == old["id"] and len(set(ids)) == 5
    for task_id, item in zip(ids, items, strict=True):
        assert (await get_task(gw, task_id))["payload"] == item["payload"]
    listed = await all_tasks(gw, runtime_id)
    assert [t["id"] for t in listed] == [old["id"], ids[0], ids[2], ids[3], ids[4]]


@pytest.mark.parametrize(
    "prefer",
    [
        "respond-async, return=minimal",
        "  RETURN = Minimal ;x=1 , wait=5",
        'handling=strict, foo="a,b", return="minimal"',
        "Return=MINIMAL",
    ],
)
async def test_return_minimal_among_other_preferences(gw, runtime_id, prefer):
    items = [{"payload": n} for n in range(3)]
    resp = await req(
        gw, "POST", batch_path(runtime_id), {"tasks": items}, headers={"Prefer": prefer}
    )
    assert [t["id"] for t in await all_tasks(gw, runtime_id)] == minimal_ids(resp)
    one = await req(gw, "POST", tasks_path(runtime_id), {"payload": 1}, headers={"Prefer": prefer})
    minimal_id(one)


@pytest.mark.parametrize(
    "prefer",
    [None, "return=representation", "respond-async", "return=minimal-ish", 'foo="return=minimal"'],
)
async def test_without_return_minimal_the_answer_is_whole_tasks(gw, runtime_id, prefer):
    headers = {"Prefer": prefer} if prefer else None
    resp = await req(
        gw, "POST", batch_path(runtime_id), {"tasks": [{"payload": 1}]}, headers=headers
    )
    assert resp.status == 201 and "Preference-Applied" not in resp.headers, resp.headers
    [task] = resp.body["tasks"]
    assert set(TASK_FIELDS) == set(task) and task["payload"] == 1
    one = await req(gw, "POST", tasks_path(runtime_id), {"payload": 2}, headers=headers)
    assert one.status == 201 and "Preference-Applied" not in one.headers, one.headers
    assert set(TASK_FIELDS) == set(one.body) and one.body["payload"] == 2


async def raw_post(gw, path: str, body: dict[str, Any], headers: dict[str, str]) -> tuple:
    """(status, headers without the per-request ones, body bytes)."""
    sent = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json", **headers}
    async with gw.http.post(gw.url + path, json=body, headers=sent) as resp:
        kept = sorted((k, v) for k, v in resp.headers.items() if k not in ("Date", "X-Request-ID"))
        return resp.status, kept, await resp.read()


async def test_return_representation_is_the_answer_without_prefer_byte_for_byte(gw, runtime_id):
    # A replay answers the same stored tasks every time: the bytes can be compared.
    keyed = {"tasks": [{"payload": {"b": [1, 2.5], "a": "é"}, "idempotency_key": "k"}]}
    single = {"payload": {"z": None}, "idempotency_key": "one"}
    assert (await req(gw, "POST", batch_path(runtime_id), keyed)).status == 201
    assert (await req(gw, "POST", tasks_path(runtime_id), single)).status == 201
    for path, body in ((batch_path(runtime_id), keyed), (tasks_path(runtime_id), single)):
        plain = await raw_post(gw, path, body, {})
        assert plain[0] == 200 and b'"payload"' in plain[2], plain
        for prefer in ("return=representation", "respond-async, return=representation"):
            assert await raw_post(gw, path, body, {"Prefer": prefer}) == plain, prefer


async def test_errors_are_unchanged_under_return_minimal(gw, runtime_id):
    items = [{"payload": {"i": i}} for i in range(50)]
    items[37] = {"payload": 1, "priority": 5000}
    resp = await req(gw, "POST", batch_path(runtime_id), {"tasks": items}, headers=MINIMAL)
    body = assert_problem(resp, 422, field="tasks[37].priority")
    assert body["index"] == 37 and "Preference-Applied" not in resp.headers
    assert await all_tasks(gw, runtime_id) == []

    await enqueue(gw, runtime_id, "taken", idempotency_key="k")
    reused = [{"payload": "new"}, {"payload": "other", "idempotency_key": "k"}]
    resp = await req(gw, "POST", batch_path(runtime_id), {"tasks": reused}, headers=MINIMAL)
    body = assert_problem(resp, 422, "idempotency_key_reused")
    assert body["index"] == 1 and "Preference-Applied" not in resp.headers
    assert len(await all_tasks(gw, runtime_id)) == 1, "a refused batch stored something"
    one = await req(
        gw,
        "POST",
        tasks_path(runtime_id),
        {"payload": "x", "idempotency_key": "k"},
        headers=MINIMAL,
    )
    assert_problem(one, 422, "idempotency_key_reused")
    assert "Preference-Applied" not in one.headers


async def test_a_minimal_batch_wakes_a_parked_claim(gw, runtime_id):
    poll = asyncio.create_task(claim(gw, runtime_id, max_tasks=5, wait_seconds=30))
    await wait_until(lambda: gw.gateway.claimer.parked(runtime_id) == 1, 10, "the poll to park")
    items = [{"payload": n} for n in range(3)]
    resp = await req(gw, "POST", batch_path(runtime_id), {"tasks": items}, headers=MINIMAL)
    ids = minimal_ids(resp)
    claimed = await asyncio.wait_for(poll, 30)
    assert [t["id"] for t in claimed] == ids


async def test_a_minimal_enqueue_hands_its_task_to_a_claim_parked_here(gw, runtime_id):
    # On the instance where the poll is parked, the task is written leased to it (sync
    # match); the producer still gets the task's id.
    poll = asyncio.create_task(claim(gw, runtime_id, wait_seconds=30))
    await wait_until(lambda: gw.gateway.claimer.parked(runtime_id) == 1, 10, "the poll to park")
    resp = await req(gw, "POST", tasks_path(runtime_id), {"payload": 7}, headers=MINIMAL)
    task_id = minimal_id(resp)
    [claimed] = await asyncio.wait_for(poll, 30)
    assert claimed["id"] == task_id and claimed["payload"] == 7


async def test_a_minimal_enqueue_on_another_instance_wakes_a_parked_claim(
    gw, runtime_id, database_url, redis_url
):
    # The poll is parked on `gw`; the enqueue goes to a second gateway sharing its
    # Redis prefix, so only the bump and its wake-up can reach the poll.
    prefix = gw.gateway.settings.redis_prefix
    async with running_gateway(make_settings(database_url, redis_url, prefix)) as other:
        poll = asyncio.create_task(claim(gw, runtime_id, wait_seconds=30))
        await wait_until(lambda: gw.gateway.claimer.parked(runtime_id) == 1, 10, "the poll")
        resp = await req(other, "POST", tasks_path(runtime_id), {"payload": 1}, headers=MINIMAL)
        task_id = minimal_id(resp)
        [claimed] = await asyncio.wait_for(poll, 30)
        assert claimed["id"] == task_id and claimed["payload"] == 1


# Each batch kind, sent as is to one runtime and with `Prefer: return=minimal` to
# another; the steps before the last one make keys exist already (replays).
FAR = "2031-01-01T00:00:00Z"
EQUIVALENT_BATCHES: dict[str, list[list[dict[str, Any]]]] = {
    "plain": [
        [{"payload": {"i": i}, "priority": i % 7, "max_attempts": 1 + i % 3} for i in range(60)]
    ],
    "timed": [
        [
            {"payload": 0, "delay_seconds": 3600},
            {"payload": 1, "ttl_seconds": 600, "priority": 9},
            {"payload": 2, "run_at": FAR, "max_attempts": 1},
            {"payload": 3},
        ]
    ],
    "keyed": [
        [
            {"payload": 0, "idempotency_key": "b"},
            {"payload": 1, "delay_seconds": 5},
            {"payload": 2, "idempotency_key": "a", "ttl_seconds": 60},
            {"payload": 0, "idempotency_key": "b"},  # the same item twice in one batch
        ]
    ],
    "replayed": [
        [{"payload": n, "idempotency_key": f"k{n}"} for n in range(3)],
        [{"payload": n, "idempotency_key": f"k{n}"} for n in (2, 0, 1)],
    ],
    "partly replayed": [
        [{"payload": n, "idempotency_key": f"k{n}"} for n in range(3)],
        [
            {"payload": "new"},
            {"payload": 1, "idempotency_key": "k1"},
            {"payload": "later", "idempotency_key": "n", "run_at": FAR},
            {"payload": 0, "idempotency_key": "k0"},
        ],
    ],
}


async def stored_rows(gw: Any, runtime: str) -> dict[str, tuple[Any, ...]]:
    """Each task's stored row by id, without its id, runtime and clock times; run_at
    and expires_at are kept where the request sets them: an absolute run_at, or the
    delay and ttl (each from the batch's own time, so exact)."""
    query = """SELECT *, payload::text AS payload_text, result::text AS result_text
                 FROM tasks WHERE runtime_id = $1"""
    rows = await gw.gateway.store.run(lambda c: c.fetch(query, runtime))
    out = {}
    for row in rows:
        fields = dict(row)
        created, run_at, expires = fields["created_at"], fields["run_at"], fields["expires_at"]
        for name in (
            *("id", "runtime_id", "created_at", "updated_at", "run_at", "expires_at"),
            *("payload", "result"),  # as their text instead
        ):
            del fields[name]
        due = run_at if run_at.year >= 2031 else run_at - created
        out[str(row["id"])] = (*sorted(fields.items()), due, expires and expires - run_at)
    return out


@pytest.mark.parametrize("kind", list(EQUIVALENT_BATCHES))
async def test_a_minimal_batch_stores_what_the_same_batch_without_it_stores(gw, runtime_id, kind):
    # The same batches go to two runtimes; the last one is sent to the second with
    # `Prefer: return=minimal`. Item by item, in request order, the ids answered must
    # name the same stored rows (field by field) as the whole tasks answered.
    whole, minimal = runtime_id + "-whole", runtime_id + "-minimal"
    same: dict[str, str] = {}  # the minimal runtime's task id -> the other's
    for step, items in enumerate(EQUIVALENT_BATCHES[kind]):
        last = step == len(EQUIVALENT_BATCHES[kind]) - 1
        plain = await req(gw, "POST", batch_path(whole), {"tasks": items})
        resp = await req(
            gw, "POST", batch_path(minimal), {"tasks": items}, headers=MINIMAL if last else None
        )
        assert plain.status in (200, 201) and resp.status == plain.status, (plain, resp)
        assert resp.headers.get("Idempotent-Replayed") == plain.headers.get("Idempotent-Replayed")
        ids = minimal_ids(resp, plain.status) if last else [t["id"] for t in resp.body["tasks"]]
        for index, (a, b) in enumerate(zip(plain.body["tasks"], ids, strict=True)):
            assert same.setdefault(b, a["id"]) == a["id"], (kind, step, index)
    rows = {runtime: await stored_rows(gw, runtime) for runtime in (whole, minimal)}
    assert len(rows[whole]) == len(rows[minimal]) == len(same)
    for b, a in same.items():
        assert rows[minimal][b] == rows[whole][a], (kind, rows[minimal][b], rows[whole][a])
    listed = [[t["id"] for t in await all_tasks(gw, rt)] for rt in (whole, minimal)]
    assert [same[b] for b in listed[1]] == listed[0]
