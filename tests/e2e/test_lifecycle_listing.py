"""Listing, stats, and the problem answers of unknown routes (design section 5)."""

from __future__ import annotations

import asyncio
import base64
import time

import pytest

from tests.support.http import req
from tests.support.lifecycle import (
    STATUSES,
    UNKNOWN_TASK,
    all_tasks,
    assert_problem,
    claim,
    claim_one,
    enqueue,
    lease_op,
    list_tasks,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def stats(inst, rt):
    resp = await req(inst, "GET", f"/v1/runtimes/{rt}/stats")
    assert resp.status == 200, resp.body
    assert resp.content_type == "application/json"
    return resp.body


# -- listing --------------------------------------------------------------------------


async def test_listing_is_oldest_first_whatever_the_priority(gw, runtime_id):
    made = [await enqueue(gw, runtime_id, i, priority=p) for i, p in enumerate([1, 900, 50, 0])]
    resp = await list_tasks(gw, runtime_id)
    assert resp.status == 200, resp.body
    assert resp.content_type == "application/json"
    assert [t["id"] for t in resp.body["tasks"]] == [t["id"] for t in made]
    assert resp.body["tasks"] == made
    assert resp.body["next_cursor"] is None


async def test_listing_pages_without_duplicates_or_gaps(gw, runtime_id):
    made = [(await enqueue(gw, runtime_id, i))["id"] for i in range(250)]
    pages, seen, cursor = [], [], None
    for _ in range(5):
        query = "?limit=100" + (f"&cursor={cursor}" if cursor else "")
        resp = await list_tasks(gw, runtime_id, query)
        assert resp.status == 200, resp.body
        pages.append(len(resp.body["tasks"]))
        seen.extend(t["id"] for t in resp.body["tasks"])
        cursor = resp.body["next_cursor"]
        if cursor is None:
            break
        assert isinstance(cursor, str) and cursor
    assert pages == [100, 100, 50]
    assert cursor is None
    assert seen == made
    default = await list_tasks(gw, runtime_id)  # limit defaults to 100
    assert [t["id"] for t in default.body["tasks"]] == made[:100]
    assert default.body["next_cursor"] is not None


async def test_listing_page_ending_exactly_at_the_last_task_has_no_cursor(gw, runtime_id):
    made = [(await enqueue(gw, runtime_id, i))["id"] for i in range(4)]
    first = await list_tasks(gw, runtime_id, "?limit=2")
    assert first.body["next_cursor"] is not None
    second = await list_tasks(gw, runtime_id, f"?limit=2&cursor={first.body['next_cursor']}")
    assert [t["id"] for t in first.body["tasks"] + second.body["tasks"]] == made
    assert second.body["next_cursor"] is None
    whole = await list_tasks(gw, runtime_id, "?limit=4")
    assert len(whole.body["tasks"]) == 4 and whole.body["next_cursor"] is None


async def test_listing_cursor_sees_tasks_added_later(gw, runtime_id):
    a = await enqueue(gw, runtime_id, "a")
    await enqueue(gw, runtime_id, "b")
    page = await list_tasks(gw, runtime_id, "?limit=1")
    assert [t["id"] for t in page.body["tasks"]] == [a["id"]]
    c = await enqueue(gw, runtime_id, "c")
    rest = await list_tasks(gw, runtime_id, f"?cursor={page.body['next_cursor']}")
    assert [t["payload"] for t in rest.body["tasks"]] == ["b", "c"]
    assert rest.body["tasks"][-1]["id"] == c["id"]


async def test_listing_status_filter(gw, runtime_id):
    made = [await enqueue(gw, runtime_id, i) for i in range(6)]
    held = await claim(gw, runtime_id, max_tasks=3)
    assert (await lease_op(gw, "complete", held[0])).status == 200
    cancelled = await req(gw, "POST", f"/v1/tasks/{made[5]['id']}/cancel")
    assert cancelled.status == 200
    expected = {
        "queued": [made[3]["id"], made[4]["id"]],
        "claimed": [made[1]["id"], made[2]["id"]],
        "completed": [made[0]["id"]],
        "cancelled": [made[5]["id"]],
        "dead": [],
        "expired": [],
    }
    for status, ids in expected.items():
        resp = await list_tasks(gw, runtime_id, f"?status={status}")
        assert resp.status == 200, resp.body
        assert [t["id"] for t in resp.body["tasks"]] == ids, status
        assert all(t["status"] == status for t in resp.body["tasks"])
    page = await list_tasks(gw, runtime_id, "?status=queued&limit=1")
    rest = await list_tasks(gw, runtime_id, f"?status=queued&cursor={page.body['next_cursor']}")
    assert [t["id"] for t in page.body["tasks"] + rest.body["tasks"]] == expected["queued"]
    assert rest.body["next_cursor"] is None
    everything = await list_tasks(gw, runtime_id)
    assert len(everything.body["tasks"]) == 6
    # An empty status is no status the document allows (an enum), not "any status".
    assert_problem(await list_tasks(gw, runtime_id, "?status="), 422, "validation_failed", "status")


@pytest.mark.parametrize(
    ("field", "query"),
    [
        ("limit", "?limit=0"),
        ("limit", "?limit=1001"),
        ("limit", "?limit=abc"),
        ("limit", "?limit=-1"),
        ("limit", "?limit=1.5"),
        ("status", "?status=running"),
        ("status", "?status=QUEUED"),
        ("cursor", "?cursor=abc"),
        ("cursor", "?cursor=!!!!"),
        ("cursor", "?cursor=" + base64.urlsafe_b64encode(b"no separator").decode()),
        ("cursor", "?cursor=" + base64.urlsafe_b64encode(b"a|b|c").decode()),
        ("cursor", "?cursor=" + base64.urlsafe_b64encode(b"2026-01-01T00:00:00|x").decode()),
        ("cursor", "?cursor=" + base64.urlsafe_b64encode(b"\xff\xfe|\x00").decode()),
    ],
)
async def test_listing_bad_query_is_422(gw, runtime_id, field, query):
    await enqueue(gw, runtime_id, 1)
    resp = await list_tasks(gw, runtime_id, query)
    assert_problem(resp, 422, "validation_failed", field)


async def test_listing_limit_1000_is_accepted(gw, runtime_id):
    await enqueue(gw, runtime_id, 1)
    resp = await list_tasks(gw, runtime_id, "?limit=1000")
    assert resp.status == 200 and len(resp.body["tasks"]) == 1, resp.body


async def test_listing_never_shows_another_runtimes_tasks(gw, runtime_id):
    other = runtime_id + "-x"
    mine = [(await enqueue(gw, runtime_id, i))["id"] for i in range(3)]
    theirs = [(await enqueue(gw, other, i))["id"] for i in range(3)]
    assert [t["id"] for t in await all_tasks(gw, runtime_id)] == mine
    assert [t["id"] for t in await all_tasks(gw, other)] == theirs
    # A cursor taken on one runtime pages that runtime only, wherever it is used.
    page = await list_tasks(gw, runtime_id, "?limit=1")
    resp = await list_tasks(gw, other, f"?cursor={page.body['next_cursor']}")
    assert resp.status == 200
    assert set(t["id"] for t in resp.body["tasks"]) <= set(theirs)
    assert await all_tasks(gw, runtime_id + "-nobody") == []
    assert (await stats(gw, runtime_id))["counts"]["queued"] == 3


# -- stats ----------------------------------------------------------------------------


async def test_stats_of_an_unused_runtime(gw, runtime_id):
    body = await stats(gw, runtime_id)
    assert body == {
        "runtime_id": runtime_id,
        "counts": dict.fromkeys(STATUSES, 0),
        "oldest_queued_age_seconds": None,
        "parked_pollers": 0,
        "paused": False,
        "paused_reason": None,
        "paused_since": None,
        "paused_until": None,
    }


async def test_stats_counts_every_status(gw, runtime_id):
    expiring = await enqueue(gw, runtime_id, "expiring", ttl_seconds=1)
    started = time.monotonic()
    for name in ("claimed", "completed", "dead", "cancel", "queued-1", "queued-2"):
        await enqueue(gw, runtime_id, name, max_attempts=1)
    # Claim in FIFO order: expiring is not yet expired, so take it first and release it.
    got = await claim(gw, runtime_id, max_tasks=4)
    assert [t["payload"] for t in got] == ["expiring", "claimed", "completed", "dead"]
    assert (await lease_op(gw, "release", got[0])).status == 200
    assert (await lease_op(gw, "complete", got[2])).status == 200
    assert (await lease_op(gw, "fail", got[3], error="x")).body["status"] == "dead"
    listed = {t["payload"]: t for t in await all_tasks(gw, runtime_id)}
    assert (await req(gw, "POST", f"/v1/tasks/{listed['cancel']['id']}/cancel")).status == 200
    body = await stats(gw, runtime_id)
    assert body["counts"] == {
        "queued": 3,
        "claimed": 1,
        "completed": 1,
        "dead": 1,
        "expired": 0,
        "cancelled": 1,
    }
    age = body["oldest_queued_age_seconds"]
    assert isinstance(age, float) and 0 <= age <= time.monotonic() - started + 1, age
    await asyncio.sleep(max(0.0, 1.1 - (time.monotonic() - started)))
    await gw.gateway.janitor.run_once()
    assert (await stats(gw, runtime_id))["counts"]["expired"] == 1
    assert expiring["id"] in {t["id"] for t in await all_tasks(gw, runtime_id)}


async def test_stats_oldest_queued_age(gw, runtime_id):
    await enqueue(gw, runtime_id, "later", delay_seconds=60)
    body = await stats(gw, runtime_id)
    assert body["counts"]["queued"] == 1
    first = await enqueue(gw, runtime_id, "old")
    await asyncio.sleep(0.3)
    await enqueue(gw, runtime_id, "new")
    age = (await stats(gw, runtime_id))["oldest_queued_age_seconds"]
    assert 0.25 <= age < 5, age
    task = await claim_one(gw, runtime_id)
    assert task["id"] == first["id"]
    assert (await stats(gw, runtime_id))["oldest_queued_age_seconds"] < age
    await claim_one(gw, runtime_id)
    body = await stats(gw, runtime_id)
    assert body["counts"]["queued"] == 1 and body["counts"]["claimed"] == 2
    assert body["oldest_queued_age_seconds"] is None  # only a task not yet due is left


async def test_stats_parked_pollers(gw, runtime_id):
    other = runtime_id + "-other"
    polls = [
        asyncio.create_task(claim(gw, runtime_id, worker=f"w{i}", wait_seconds=3)) for i in range(3)
    ]
    deadline = time.monotonic() + 2
    while (await stats(gw, runtime_id))["parked_pollers"] != 3:
        assert time.monotonic() < deadline, "the polls never showed as parked"
        await asyncio.sleep(0.02)
    assert (await stats(gw, other))["parked_pollers"] == 0
    assert not any(p.done() for p in polls)
    made = [(await enqueue(gw, runtime_id, i))["id"] for i in range(3)]
    results = await asyncio.wait_for(asyncio.gather(*polls), 2.5)
    assert sorted(t["id"] for r in results for t in r) == sorted(made)
    assert all(len(r) == 1 for r in results)
    body = await stats(gw, runtime_id)
    assert body["parked_pollers"] == 0
    assert body["counts"]["claimed"] == 3 and body["counts"]["queued"] == 0


async def test_stats_parked_pollers_drop_when_the_wait_runs_out(gw, runtime_id):
    poll = asyncio.create_task(claim(gw, runtime_id, wait_seconds=0.5))
    await asyncio.sleep(0.2)
    assert (await stats(gw, runtime_id))["parked_pollers"] == 1
    assert await poll == []
    assert (await stats(gw, runtime_id))["parked_pollers"] == 0


# -- unknown routes and methods -------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/nope"),
        ("GET", "/v1/tasks"),
        ("POST", "/v1/runtimes/rt/tasks/extra"),
        ("POST", f"/v1/tasks/{UNKNOWN_TASK}/explode"),
        ("GET", "/v2/runtimes/rt/stats"),
    ],
)
async def test_unknown_path_is_404_problem(gw, method, path):
    assert_problem(await req(gw, method, path), 404, "not_found")
    assert_problem(await req(gw, method, path, auth=None), 404, "not_found")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/runtimes/rt/claim"),
        ("DELETE", "/v1/runtimes/rt/tasks"),
        ("PUT", "/v1/runtimes/rt/tasks"),
        ("GET", "/v1/runtimes/rt/tasks:batch"),
        ("DELETE", f"/v1/tasks/{UNKNOWN_TASK}"),
        ("GET", f"/v1/tasks/{UNKNOWN_TASK}/complete"),
        ("POST", "/v1/runtimes/rt/stats"),
        ("POST", "/healthz"),
    ],
)
async def test_wrong_method_is_405_problem(gw, method, path):
    body = assert_problem(await req(gw, method, path), 405, "method_not_allowed")
    assert method in body["detail"]


async def test_listing_limit_with_a_non_ascii_digit_is_422(gw, runtime_id):
    resp = await list_tasks(gw, runtime_id, "?limit=%C2%B2")  # "²"
    assert_problem(resp, 422, "validation_failed", "limit")


@pytest.mark.parametrize(
    "when", [b"0001-01-01T00:00:00+14:00", b"9999-12-31T23:59:59-14:00"], ids=["y0", "y10000"]
)
async def test_listing_cursor_with_an_unstorable_time_is_422(gw, runtime_id, when):
    cursor = base64.urlsafe_b64encode(when + b"|" + UNKNOWN_TASK.encode()).decode()
    resp = await list_tasks(gw, runtime_id, f"?cursor={cursor}")
    assert_problem(resp, 422, "validation_failed", "cursor")
