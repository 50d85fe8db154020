"""GET /v1/runtimes, the console's listing of runtimes with live tasks: paging, counts,
what a token sees, and bad queries (design section 5)."""

from __future__ import annotations

import base64
import secrets

import pytest

from gateway.runtimes import PATTERN_WALK
from gateway_client import AsyncClient, ValidationFailed
from tests.e2e.credentials_support import make_token
from tests.e2e.lifecycle_support import assert_problem, claim, enqueue
from tests.support.http import req

pytestmark = pytest.mark.asyncio(loop_scope="module")


def prefix() -> str:
    return "con-" + secrets.token_hex(5)


async def every_page(gw, limit: int, auth=None) -> tuple[list[dict], list[int]]:
    """Every runtime listed, following next_cursor, and the size of each page."""
    seen: list[dict] = []
    sizes: list[int] = []
    cursor = None
    for _ in range(10_000):
        query = f"?limit={limit}" + (f"&cursor={cursor}" if cursor else "")
        kw = {} if auth is None else {"auth": auth}
        resp = await req(gw, "GET", "/v1/runtimes" + query, **kw)
        assert resp.status == 200, resp.body
        assert resp.content_type == "application/json"
        seen.extend(resp.body["runtimes"])
        sizes.append(len(resp.body["runtimes"]))
        cursor = resp.body["next_cursor"]
        if cursor is None:
            return seen, sizes
    raise AssertionError("the listing never ended")


async def test_counts_of_a_runtime(gw):
    rt = prefix()
    for i in range(3):
        await enqueue(gw, rt, i)
    await enqueue(gw, rt, "later", delay_seconds=3600)  # not yet due: queued, not oldest
    # Due long ago and expired a second later: expired, so neither counted nor oldest.
    await enqueue(gw, rt, "gone", run_at="2020-01-01T00:00:00Z", ttl_seconds=1)
    await claim(gw, rt, max_tasks=2)
    token = await make_token(gw, ["read"], [rt])
    resp = await req(gw, "GET", "/v1/runtimes", auth=token["token"])
    assert resp.status == 200, resp.body
    assert resp.body["next_cursor"] is None
    [row] = resp.body["runtimes"]
    assert row["runtime_id"] == rt
    assert row["queued"] == 2  # one due, one not yet due
    assert row["claimed"] == 2
    assert row["parked_pollers"] == 0
    assert row["claims_per_minute"] == 2  # the two tasks claimed above
    assert isinstance(row["oldest_queued_age_seconds"], float)
    assert 0 <= row["oldest_queued_age_seconds"] < 600


async def test_a_runtime_whose_tasks_all_finished_stays_listed(gw):
    """A runtime whose work is all done (a worker took every task) is still listed,
    from its finished-task counters, with nothing queued or claimed."""
    rt = prefix()
    task = await enqueue(gw, rt, 1)
    assert (await req(gw, "POST", f"/v1/tasks/{task['id']}/cancel")).status == 200
    token = await make_token(gw, ["read"], [rt])
    resp = await req(gw, "GET", "/v1/runtimes", auth=token["token"])
    assert resp.status == 200, resp.body
    [row] = resp.body["runtimes"]
    assert (row["runtime_id"], row["queued"], row["claimed"]) == (rt, 0, 0)


async def test_a_runtime_with_controls_and_no_tasks_is_listed(gw):
    rt = prefix()
    assert (await req(gw, "POST", f"/v1/runtimes/{rt}:pause")).status == 200
    token = await make_token(gw, ["read"], [rt])
    resp = await req(gw, "GET", "/v1/runtimes", auth=token["token"])
    assert resp.status == 200, resp.body
    [row] = resp.body["runtimes"]
    assert (row["runtime_id"], row["paused"], row["queued"]) == (rt, True, 0)


async def test_paging_lists_every_runtime_once_in_id_order(gw):
    base = prefix()
    mine = [f"{base}-{i:03d}" for i in range(23)]
    for rt in mine:
        await enqueue(gw, rt, rt)
    await claim(gw, mine[5])  # a runtime with only a claimed task is listed too
    seen, sizes = await every_page(gw, 5)
    ids = [r["runtime_id"] for r in seen]
    assert ids == sorted(ids)
    assert len(ids) == len(set(ids))
    assert [rt for rt in ids if rt.startswith(base)] == mine
    assert all(size == 5 for size in sizes[:-1]) and 0 < sizes[-1] <= 5
    row = next(r for r in seen if r["runtime_id"] == mine[5])
    assert (row["queued"], row["claimed"]) == (0, 1)


async def test_a_pattern_token_sees_only_its_runtimes_page_by_page(gw):
    base = prefix()
    mine = [f"{base}-in-{i}" for i in range(7)]
    others = [f"{base}-out-{i}" for i in range(3)]
    for rt in mine + others:
        await enqueue(gw, rt, rt)
    token = await make_token(gw, ["read"], [f"{base}-in-*"])
    seen, sizes = await every_page(gw, 3, auth=token["token"])
    assert [r["runtime_id"] for r in seen] == mine
    assert max(sizes) <= 3
    # The admin sees both.
    admin, _ = await every_page(gw, 1000)
    listed = {r["runtime_id"] for r in admin}
    assert set(mine + others) <= listed


async def test_a_pattern_token_pages_past_many_runtimes_it_does_not_cover(gw):
    """The walk per page is bounded: a token whose pattern starts with `*` (it may cover
    any runtime) and covers one after more than PATTERN_WALK others gets an empty page
    with a cursor first, then its runtime. A pattern with a literal prefix starts its
    walk at that prefix, so its runtime is on the first page."""
    base = prefix()
    batch = [{"payload": 0}]
    for i in range(PATTERN_WALK + 5):
        resp = await req(gw, "POST", f"/v1/runtimes/{base}-a{i:05d}/tasks:batch", {"tasks": batch})
        assert resp.status == 201, resp.body
    await enqueue(gw, f"{base}-z", "mine")
    anywhere = await make_token(gw, ["read"], [f"*{base}-z"])
    first = await req(
        gw, "GET", "/v1/runtimes?cursor=" + cursor_after(base), auth=anywhere["token"]
    )
    assert first.status == 200, first.body
    assert first.body["runtimes"] == [] and first.body["next_cursor"]
    seen, _ = await every_page(gw, 10, auth=anywhere["token"])
    assert [r["runtime_id"] for r in seen] == [f"{base}-z"]
    for pattern in (f"{base}-z", f"{base}-z*"):
        token = await make_token(gw, ["read"], [pattern])
        resp = await req(gw, "GET", "/v1/runtimes", auth=token["token"])
        assert resp.status == 200, resp.body
        assert [r["runtime_id"] for r in resp.body["runtimes"]] == [f"{base}-z"], pattern


def cursor_after(runtime_id: str) -> str:
    return base64.urlsafe_b64encode(runtime_id.encode()).decode().rstrip("=")


async def test_read_scope_is_needed(gw):
    rt = prefix()
    await enqueue(gw, rt, 1)
    for scopes in (["enqueue"], ["claim"], ["enqueue", "claim"]):
        token = await make_token(gw, scopes)
        resp = await req(gw, "GET", "/v1/runtimes", auth=token["token"])
        assert_problem(resp, 403, "forbidden")
        assert "read" in resp.body["detail"]
    assert_problem(await req(gw, "GET", "/v1/runtimes", auth=None), 401)
    token = await make_token(gw, ["read"])
    assert (await req(gw, "GET", "/v1/runtimes?limit=1", auth=token["token"])).status == 200


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("limit=-1", "limit"),
        ("limit=ten", "limit"),
        ("limit=" + "9" * 5000, "limit"),
        ("cursor=***", "cursor"),
        ("cursor=" + cursor_after("bad id with spaces"), "cursor"),
        ("cursor=%00", "cursor"),
        ("cursor=" + base64.urlsafe_b64encode(b"\xff\xfe").decode(), "cursor"),
    ],
)
async def test_bad_queries_are_422_naming_the_field(gw, query, field):
    body = assert_problem(
        await req(gw, "GET", "/v1/runtimes?" + query), 422, "validation_failed", field
    )
    assert body["field"] == field


async def test_a_trailing_slash_is_404(gw):
    assert_problem(await req(gw, "GET", "/v1/runtimes/"), 404, "not_found")


async def test_the_openapi_document_describes_it(gw):
    resp = await req(gw, "GET", "/openapi.json", auth=None)
    operation = resp.body["paths"]["/v1/runtimes"]["get"]
    assert operation["operationId"] == "listRuntimes"
    assert {p["name"] for p in operation["parameters"]} == {"limit", "cursor"}
    assert {"200", "401", "403", "422"} <= set(operation["responses"])


async def test_the_python_client_lists_runtimes(gw):
    base = prefix()
    mine = [f"{base}-{i}" for i in range(5)]
    for rt in mine:
        await enqueue(gw, rt, rt)
    await claim(gw, mine[0])
    token = await make_token(gw, ["read"], [f"{base}-*"])
    async with AsyncClient(gw.url, token["token"]) as client:
        page = await client.list_runtimes(limit=2)
        assert [r.runtime_id for r in page.runtimes] == mine[:2] and page.next_cursor
        assert (page.runtimes[0].queued, page.runtimes[0].claimed) == (0, 1)
        everything = [r.runtime_id async for r in client.iter_runtimes(page_size=2)]
        assert everything == mine
        with pytest.raises(ValidationFailed) as bad:
            await client.list_runtimes(cursor="not-a-cursor!")
        assert bad.value.field == "cursor"
