"""Scoped API tokens through the HTTP API: the admin endpoints, and tokens at work."""

from __future__ import annotations

import asyncio
import re
import time
import uuid

import pytest

from gateway.auth.principals import TOKEN_CACHE_TTL_SECONDS
from tests.support.credentials import every_token, make_secret, make_token, unique
from tests.support.databases import rows
from tests.support.http import req
from tests.support.lifecycle import (
    assert_problem,
    enqueue,
)

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.integration]

TOKEN_RE = re.compile(r"^gwt_[A-Za-z0-9_-]{43}$")


# -- admin API: tokens ------------------------------------------------------------------


async def test_create_answers_the_secret_once(gw):
    resp = await req(
        gw, "POST", "/v1/admin/tokens", {"name": unique("t"), "scopes": ["read"], "runtimes": ["a"]}
    )
    assert resp.status == 201, resp.body
    assert resp.headers["Cache-Control"] == "no-store"
    assert set(resp.body) == {"id", "name", "scopes", "runtimes", "token", "created_at"}
    assert TOKEN_RE.match(resp.body["token"])
    assert (resp.body["scopes"], resp.body["runtimes"]) == (["read"], ["a"])
    listed, _ = await every_token(gw)
    [mine] = [t for t in listed if t["id"] == resp.body["id"]]
    assert set(mine) == {"id", "name", "scopes", "runtimes", "created_at", "revoked_at"}
    assert mine["revoked_at"] is None
    assert "gwt_" not in str(listed)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"scopes": ["read"]}, "name"),
        ({"name": "x y", "scopes": ["read"]}, "name"),
        ({"name": "n"}, "scopes"),
        ({"name": "n", "scopes": ["read", "write"]}, "scopes"),
        ({"name": "n", "scopes": ["read"], "runtimes": []}, "runtimes"),
        ({"name": "n", "scopes": ["read"], "runtimes": ["a/b"]}, "runtimes"),
        ({"name": "n", "scopes": ["admin"], "runtimes": ["a"]}, "runtimes"),
        ({"name": "n", "scopes": ["read"], "runtime": ["a"]}, "runtime"),
    ],
)
async def test_create_validation_names_the_field_and_stores_nothing(gw, body, field):
    before = await rows(gw, "SELECT id FROM api_tokens")
    assert_problem(await req(gw, "POST", "/v1/admin/tokens", body), 422, "validation_failed", field)
    assert await rows(gw, "SELECT id FROM api_tokens") == before


async def test_create_refuses_a_body_that_is_not_json(gw):
    resp = await req(gw, "POST", "/v1/admin/tokens", raw=b"{nope")
    assert_problem(resp, 400, "bad_request")


async def test_a_duplicate_live_name_is_409(gw):
    name = unique("dup")
    first = await make_token(gw, ["read"], name=name)
    resp = await req(gw, "POST", "/v1/admin/tokens", {"name": name, "scopes": ["claim"]})
    assert_problem(resp, 409, "already_exists", "name")
    assert len(await rows(gw, "SELECT id FROM api_tokens WHERE name = $1", name)) == 1
    # Once revoked, the name is free again.
    assert (await req(gw, "DELETE", f"/v1/admin/tokens/{first['id']}")).status == 204
    await make_token(gw, ["read"], name=name)


async def test_revoke(gw, runtime_id):
    token = await make_token(gw, ["read"])
    ok = await req(gw, "GET", f"/v1/runtimes/{runtime_id}/stats", auth=token["token"])
    assert ok.status == 200
    resp = await req(gw, "DELETE", f"/v1/admin/tokens/{token['id']}")
    assert (resp.status, resp.body) == (204, None)
    # The instance that revoked it forgets it at once (others within 2 s).
    refused = await req(gw, "GET", f"/v1/runtimes/{runtime_id}/stats", auth=token["token"])
    assert_problem(refused, 401, "unauthorized")
    assert (await req(gw, "DELETE", f"/v1/admin/tokens/{token['id']}")).status == 204
    listed, _ = await every_token(gw)
    assert token["id"] not in [t["id"] for t in listed]
    every, _ = await every_token(gw, "&include_revoked=true")
    [gone] = [t for t in every if t["id"] == token["id"]]
    assert gone["revoked_at"] is not None
    bad = await req(gw, "GET", "/v1/admin/tokens?include_revoked=maybe")
    assert_problem(bad, 422, "validation_failed", "include_revoked")


async def test_the_listing_pages_through_more_tokens_than_a_page(gw):
    """With a small `limit`, every token is listed once, oldest first, a page at a time;
    revoked ones only with include_revoked, in their place."""
    made = [await make_token(gw, ["read"], name=unique("page")) for _ in range(7)]
    gone = made[3]
    assert (await req(gw, "DELETE", f"/v1/admin/tokens/{gone['id']}")).status == 204
    live, sizes = await every_token(gw, limit=2)
    assert all(size == 2 for size in sizes[:-1]) and sizes[-1] <= 2 and len(sizes) >= 4
    ids = [t["id"] for t in live]
    assert len(ids) == len(set(ids))
    assert [i for i in ids if i in {t["id"] for t in made}] == [
        t["id"] for t in made if t is not gone
    ]
    keys = [(t["created_at"], t["id"]) for t in live]
    assert keys == sorted(keys)  # oldest first (times compare as strings)
    every, _ = await every_token(gw, "&include_revoked=true", limit=3)
    assert [t["id"] for t in every if t["id"] in {m["id"] for m in made}] == [t["id"] for t in made]
    first = await req(gw, "GET", "/v1/admin/tokens?limit=1")
    assert len(first.body["tokens"]) == 1 and first.body["next_cursor"]
    whole = await req(gw, "GET", "/v1/admin/tokens?limit=1000")
    assert whole.body["tokens"][:1] == first.body["tokens"]


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("limit=-1", "limit"),
        ("limit=ten", "limit"),
        ("limit=" + "9" * 5000, "limit"),
        ("cursor=***", "cursor"),
        ("cursor=bm9wZQ", "cursor"),  # base64 of "nope"
        ("cursor=%00", "cursor"),
        ("include_revoked=maybe&limit=2", "include_revoked"),
    ],
)
async def test_bad_listing_queries_are_422_naming_the_field(gw, query, field):
    resp = await req(gw, "GET", "/v1/admin/tokens?" + query)
    assert assert_problem(resp, 422, "validation_failed", field)["field"] == field


# A fixed id: parameters must be the same in every collection (parallel workers).
@pytest.mark.parametrize("token_id", ["5d0e2b57-3c1f-4f7e-9a55-0c6f6a0d2b11", "not-a-uuid"])
async def test_revoking_an_unknown_token_is_404(gw, token_id):
    assert_problem(await req(gw, "DELETE", f"/v1/admin/tokens/{token_id}"), 404, "not_found")


# -- admin API: webhook secrets -----------------------------------------------------------


async def test_webhook_secret_admin(gw):
    resp = await req(
        gw, "POST", "/v1/admin/webhook-secrets", {"name": unique("w"), "runtimes": ["a-*"]}
    )
    assert resp.status == 201, resp.body
    assert resp.headers["Cache-Control"] == "no-store"
    assert set(resp.body) == {"id", "name", "runtimes", "secret", "created_at"}
    assert resp.body["secret"].startswith("whsec_")
    listed = await req(gw, "GET", "/v1/admin/webhook-secrets")
    [mine] = [s for s in listed.body["webhook_secrets"] if s["id"] == resp.body["id"]]
    assert set(mine) == {"id", "name", "runtimes", "created_at", "revoked_at"}
    assert "whsec_" not in str(listed.body)
    dup = await req(
        gw, "POST", "/v1/admin/webhook-secrets", {"name": mine["name"], "runtimes": ["b"]}
    )
    assert_problem(dup, 409, "already_exists", "name")
    assert (await req(gw, "DELETE", f"/v1/admin/webhook-secrets/{mine['id']}")).status == 204
    assert (await req(gw, "DELETE", f"/v1/admin/webhook-secrets/{mine['id']}")).status == 204
    unknown = await req(gw, "DELETE", f"/v1/admin/webhook-secrets/{uuid.uuid4()}")
    assert_problem(unknown, 404, "not_found")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "w"}, "runtimes"),
        ({"name": "w", "runtimes": []}, "runtimes"),
        ({"name": "w", "runtimes": ["a b"]}, "runtimes"),
        ({"runtimes": ["a"]}, "name"),
        ({"name": "w", "runtimes": ["a"], "scopes": ["read"]}, "scopes"),
    ],
)
async def test_webhook_secret_validation(gw, body, field):
    resp = await req(gw, "POST", "/v1/admin/webhook-secrets", body)
    assert_problem(resp, 422, "validation_failed", field)


# -- tokens at work ---------------------------------------------------------------------


async def test_enqueue_only_and_claim_only_tokens_round_trip(gw, runtime_id):
    producer = (await make_token(gw, ["enqueue"], [runtime_id]))["token"]
    daemon = (await make_token(gw, ["claim"], [runtime_id]))["token"]
    tasks = f"/v1/runtimes/{runtime_id}/tasks"
    created = await req(gw, "POST", tasks, {"payload": {"n": 1}}, auth=producer)
    assert created.status == 201, created.body
    # Each lacks the other's scope, and neither may read.
    claim_body = {"worker_id": "w"}
    claim_path = f"/v1/runtimes/{runtime_id}/claim"
    assert_problem(await req(gw, "POST", claim_path, claim_body, auth=producer), 403, "forbidden")
    assert_problem(await req(gw, "POST", tasks, {"payload": 2}, auth=daemon), 403, "forbidden")
    assert_problem(await req(gw, "GET", tasks, auth=daemon), 403, "forbidden")
    claimed = await req(gw, "POST", claim_path, claim_body, auth=daemon)
    assert claimed.status == 200, claimed.body
    [task] = claimed.body["tasks"]
    assert task["id"] == created.body["id"]
    lease = {"lease_id": task["lease_id"]}
    beat = await req(gw, "POST", f"/v1/tasks/{task['id']}/heartbeat", lease, auth=daemon)
    assert beat.status == 200, beat.body
    done = await req(
        gw, "POST", f"/v1/tasks/{task['id']}/complete", {**lease, "result": 1}, auth=daemon
    )
    assert (done.status, done.body["status"]) == (200, "completed")
    cancel = await req(gw, "POST", f"/v1/tasks/{task['id']}/cancel", auth=daemon)
    assert_problem(cancel, 403, "forbidden")


async def test_a_glob_covers_its_runtimes_only(gw):
    tag = unique("ci")
    token = (await make_token(gw, ["enqueue", "read"], [f"{tag}-*"]))["token"]
    mine = await req(gw, "POST", f"/v1/runtimes/{tag}-linux/tasks", {"payload": 1}, auth=token)
    assert mine.status == 201, mine.body
    got = await req(gw, "GET", f"/v1/tasks/{mine.body['id']}", auth=token)
    assert got.status == 200 and got.body["runtime_id"] == f"{tag}-linux"
    for other in (f"{tag}", f"x{tag}-linux", f"{tag}_linux"):
        resp = await req(gw, "POST", f"/v1/runtimes/{other}/tasks", {"payload": 1}, auth=token)
        assert_problem(resp, 403, "forbidden")
    foreign = await enqueue(gw, f"x{tag}-linux", 1)
    resp = await req(gw, "GET", f"/v1/tasks/{foreign['id']}", auth=token)
    assert_problem(resp, 404, "not_found")
    assert resp.body["detail"] == f"no task with id {foreign['id']}"  # as if it did not exist


async def test_a_token_without_the_admin_scope_cannot_mint_tokens(gw):
    token = (await make_token(gw, ["enqueue", "claim", "read"]))["token"]
    resp = await req(
        gw, "POST", "/v1/admin/tokens", {"name": unique("x"), "scopes": ["admin"]}, auth=token
    )
    assert_problem(resp, 403, "forbidden")
    assert_problem(await req(gw, "GET", "/v1/admin/webhook-secrets", auth=token), 403, "forbidden")


async def test_an_issued_admin_token_can_do_admin_work(gw, runtime_id):
    admin = (await make_token(gw, ["admin"]))["token"]
    made = await req(
        gw, "POST", "/v1/admin/tokens", {"name": unique("m"), "scopes": ["read"]}, auth=admin
    )
    assert made.status == 201
    assert (await req(gw, "GET", f"/v1/runtimes/{runtime_id}/stats", auth=admin)).status == 200
    await make_secret(gw, [runtime_id])


@pytest.mark.parametrize(
    "header",
    [
        "Bearer gwt_" + "x" * 43,
        "Bearer gwt_",
        "Bearer not-a-gateway-token",
        "Bearer " + "gwt_" * 60,
    ],
    ids=["unknown", "prefix-only", "no-prefix", "too-long"],
)
async def test_unknown_tokens_are_401_with_a_challenge(gw, runtime_id, header):
    resp = await req(
        gw, "GET", f"/v1/runtimes/{runtime_id}/stats", auth=None, headers={"Authorization": header}
    )
    assert_problem(resp, 401, "unauthorized")
    assert resp.headers["WWW-Authenticate"] == 'Bearer realm="claim-gateway", error="invalid_token"'


async def test_tokens_are_read_once_per_cache_period(gw, runtime_id, monkeypatch):
    auth = gw.gateway.auth
    token = (await make_token(gw, ["read"]))["token"]
    loads: list[bytes] = []
    real = auth._lookup

    async def counting(secret_hash: bytes):
        loads.append(secret_hash)
        return await real(secret_hash)

    monkeypatch.setattr(auth, "_lookup", counting)
    auth.cache.clear()
    started = time.monotonic()
    path = f"/v1/runtimes/{runtime_id}/stats"
    results = await asyncio.gather(*(req(gw, "GET", path, auth=token) for _ in range(20)))
    assert [r.status for r in results] == [200] * 20
    unknown = "gwt_" + "u" * 43
    for _ in range(5):  # a miss is remembered too
        assert (await req(gw, "GET", path, auth=unknown)).status == 401
    # Two loads, unless this machine took longer than an entry's life for all of it.
    assert len(loads) == 2 or time.monotonic() - started > TOKEN_CACHE_TTL_SECONDS
