"""GET /v1/runtimes, the console's listing of runtimes with live tasks: paging, counts,
what a token sees, and bad queries (design section 5)."""

from __future__ import annotations

import base64
import binascii
import contextlib
import gzip
import re
import secrets
import string
import urllib.parse
import zlib
from dataclasses import dataclass

import orjson
import pytest
import pytest_asyncio

from gateway.api.bodies import PATTERN_WALK
from gateway_client import AsyncClient, ValidationFailed
from tests.support.credentials import make_token
from tests.support.gateways import TOKEN, gateway
from tests.support.http import req
from tests.support.lifecycle import assert_problem, claim, enqueue

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
    with a cursor on the way, then its runtime. A pattern with a literal prefix starts
    its walk at that prefix, so its runtime is on the first page."""
    base = prefix()
    batch = [{"payload": 0}]
    for i in range(PATTERN_WALK + 5):
        resp = await req(gw, "POST", f"/v1/runtimes/{base}-a{i:05d}/tasks:batch", {"tasks": batch})
        assert resp.status == 201, resp.body
    await enqueue(gw, f"{base}-z", "mine")
    anywhere = await make_token(gw, ["read"], [f"*{base}-z"])
    seen, sizes = await every_page(gw, 10, auth=anywhere["token"])
    assert [r["runtime_id"] for r in seen] == [f"{base}-z"]
    assert 0 in sizes  # a page that walked only runtimes it does not cover
    for pattern in (f"{base}-z", f"{base}-z*"):
        token = await make_token(gw, ["read"], [pattern])
        resp = await req(gw, "GET", "/v1/runtimes", auth=token["token"])
        assert resp.status == 200, resp.body
        assert [r["runtime_id"] for r in resp.body["runtimes"]] == [f"{base}-z"], pattern


def cursor_after(runtime_id: str) -> str:
    """A cursor in the format the server once issued: the runtime id in base64url."""
    return base64.urlsafe_b64encode(runtime_id.encode()).decode().rstrip("=")


# -- cursors that tell a token nothing of runtimes it does not cover -----------------------


@dataclass(frozen=True)
class Tenants:
    """Runtimes of two tenants whose ids share a prefix: `foreign` (more than one walk
    of them) sort right after the literal prefix of `pattern`, which covers `mine`
    alone, before, between and after them."""

    base: str
    pattern: str
    mine: list[str]
    foreign: list[str]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def tenants(gw) -> Tenants:
    base = prefix()
    foreign = [f"{base}-m{i:05d}" for i in range(PATTERN_WALK + 1)]
    mine = [f"{base}-m{i:05d}-mine" for i in (0, 400, 999, 1000)] + [f"{base}-mz-mine"]
    batch = {"tasks": [{"payload": 0}]}
    for rt in foreign + mine:
        resp = await req(gw, "POST", f"/v1/runtimes/{rt}/tasks:batch", batch)
        assert resp.status == 201, resp.body
    return Tenants(base, f"{base}-m*-mine", sorted(mine), foreign)


async def raw_page(gw, token: str, limit: int, cursor: str | None) -> tuple[int, str]:
    """One page of GET /v1/runtimes: its status and its body's exact text."""
    query = f"?limit={limit}" + (f"&cursor={cursor}" if cursor else "")
    headers = {"Authorization": f"Bearer {token}"}
    async with gw.http.get(gw.url + "/v1/runtimes" + query, headers=headers) as resp:
        return resp.status, await resp.text()


def readings(cursor: str) -> list[bytes]:
    """The cursor, and every reading of it a client might try: base64 in both alphabets
    from each offset, base32, hex, and those inflated (zlib, gzip)."""
    texts = [cursor, urllib.parse.unquote(cursor)]
    texts += [cursor.replace("-", "+").replace("_", "/")]
    out = [t.encode() for t in texts]
    for text in texts:
        for skip in range(4):
            part = text[skip:]
            padded = part + "=" * (-len(part) % 4)
            decoders = (base64.urlsafe_b64decode, base64.b64decode, base64.b32decode)
            for decode in decoders:
                with contextlib.suppress(ValueError, binascii.Error):
                    out.append(decode(padded))
            with contextlib.suppress(ValueError):
                out.append(bytes.fromhex(part))
    for raw in list(out):
        for inflate in (zlib.decompress, gzip.decompress):
            with contextlib.suppress(Exception):
                out.append(inflate(raw))
    return out


async def test_a_limited_token_never_reads_a_runtime_it_does_not_cover(gw, tenants):
    """A `read` token limited to a pattern pages past 1,001 runtimes it does not cover
    (its walks end on them): no answer names one of them, in its runtimes or in its
    cursor read in any way, and every runtime it covers is listed exactly once."""
    token = (await make_token(gw, ["read"], [tenants.pattern]))["token"]
    names = re.compile(re.escape(tenants.base) + r"-m[0-9z]*(?:-mine)?")
    listed: list[str] = []
    cursors: list[str] = []
    cursor = None
    for _ in range(1000):
        status, text = await raw_page(gw, token, 2, cursor)
        assert status == 200, text
        named = set(names.findall(text))
        assert named <= set(tenants.mine), sorted(named - set(tenants.mine))[:5]
        body = orjson.loads(text)
        listed += [r["runtime_id"] for r in body["runtimes"]]
        cursor = body["next_cursor"]
        if cursor is None:
            break
        cursors.append(cursor)
    assert listed == tenants.mine
    assert len(cursors) >= 2  # a page cut by the walk, then one cut by `limit`
    for cursor in cursors:
        for raw in readings(cursor):
            assert tenants.base.encode() not in raw.lower(), (cursor, raw)
            assert not any(f"m{i:05d}".encode() in raw for i in range(0, 1001, 97)), raw


async def test_a_cursor_the_server_did_not_issue_is_refused(gw, tenants):
    """A cursor written by the client (the runtime id in base64, as the server once
    issued them) would let a token ask which runtime follows any name: 422."""
    token = (await make_token(gw, ["read"], [tenants.pattern]))["token"]
    for after in (tenants.foreign[500], tenants.mine[0], tenants.base):
        for auth in (token, None):
            kw = {} if auth is None else {"auth": auth}
            resp = await req(gw, "GET", "/v1/runtimes?cursor=" + cursor_after(after), **kw)
            body = assert_problem(resp, 422, "validation_failed", "cursor")
            assert body["detail"] == "cursor is not one this server returned as next_cursor"


async def test_a_changed_cursor_is_refused(gw, tenants):
    token = (await make_token(gw, ["read"], [tenants.pattern]))["token"]
    status, text = await raw_page(gw, token, 1, None)
    assert status == 200, text
    cursor = orjson.loads(text)["next_cursor"]
    assert cursor
    alphabet = string.ascii_letters + string.digits + "-_"
    for i, char in enumerate(cursor):
        changed = alphabet[(alphabet.index(char) + 1) % len(alphabet)]
        tampered = cursor[:i] + changed + cursor[i + 1 :]
        resp = await req(gw, "GET", f"/v1/runtimes?limit=1&cursor={tampered}", auth=token)
        assert_problem(resp, 422, "validation_failed", "cursor")
    for tampered in (cursor[:-1], cursor + "A", cursor[1:]):
        resp = await req(gw, "GET", f"/v1/runtimes?limit=1&cursor={tampered}", auth=token)
        assert_problem(resp, 422, "validation_failed", "cursor")
    # The cursor as issued still works.
    assert (await raw_page(gw, token, 1, cursor))[0] == 200


async def test_a_cursor_works_only_for_the_token_it_was_issued_to(gw, tenants):
    """Token B, even with the very same pattern, cannot go on from token A's cursor;
    nor can the admin, nor A from the admin's."""
    a = (await make_token(gw, ["read"], [tenants.pattern]))["token"]
    b = (await make_token(gw, ["read"], [tenants.pattern]))["token"]
    everywhere = (await make_token(gw, ["read"]))["token"]
    status, text = await raw_page(gw, a, 1, None)
    assert status == 200, text
    of_a = orjson.loads(text)["next_cursor"]
    assert of_a
    for other in (b, everywhere, TOKEN):
        resp = await req(gw, "GET", f"/v1/runtimes?limit=1&cursor={of_a}", auth=other)
        assert_problem(resp, 422, "validation_failed", "cursor")
    admin = await req(gw, "GET", "/v1/runtimes?limit=1")
    assert admin.status == 200 and admin.body["next_cursor"]
    for other in (a, everywhere):
        resp = await req(gw, "GET", f"/v1/runtimes?cursor={admin.body['next_cursor']}", auth=other)
        assert_problem(resp, 422, "validation_failed", "cursor")
    assert (await raw_page(gw, a, 1, of_a))[0] == 200


async def test_another_replica_goes_on_from_a_cursor(gw, tenants, database_url, redis_url):
    """Replicas behind one load balancer share the admin token, and so the cursor's key:
    a page from one goes on at another. A server with another admin token (after a
    rotation) refuses the cursor, and the client starts again."""
    token = (await make_token(gw, ["read"], [tenants.pattern]))["token"]
    first = await req(gw, "GET", "/v1/runtimes?limit=1", auth=token)
    assert first.status == 200 and first.body["next_cursor"], first.body
    cursor = first.body["next_cursor"]
    async with gateway(database_url, redis_url) as replica:
        listed = [r["runtime_id"] for r in first.body["runtimes"]]
        while cursor is not None:
            resp = await req(replica, "GET", f"/v1/runtimes?cursor={cursor}", auth=token)
            assert resp.status == 200, resp.body
            listed += [r["runtime_id"] for r in resp.body["runtimes"]]
            cursor = resp.body["next_cursor"]
        assert listed == tenants.mine
    rotated = "another-admin-token-" + secrets.token_hex(16)
    async with gateway(database_url, redis_url, admin_token=rotated) as replica:
        query = f"/v1/runtimes?cursor={first.body['next_cursor']}"
        resp = await req(replica, "GET", query, auth=token)
        assert_problem(resp, 422, "validation_failed", "cursor")


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
    assert {p["name"] for p in operation["parameters"]} == {"limit", "cursor", "include"}
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
