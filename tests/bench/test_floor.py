"""The bare Starlette floor answers like a claim endpoint, with and without its MGET."""

from __future__ import annotations

import orjson
import pytest
import redis.asyncio as aioredis

from bench.floor import create_app, create_mget_app
from tests.support.asgi import lifespan, post


async def test_floor_parses_the_body_and_answers_json() -> None:
    app = create_app()
    status, body = await post(app, "/v1/runtimes/rt-1/claim", b'{"worker_id": "w"}')
    assert (status, orjson.loads(body)) == (200, {"tasks": []})


async def test_floor_refuses_a_body_that_is_not_json() -> None:
    status, body = await post(create_app(), "/v1/runtimes/rt-1/claim", b"{not json")
    assert status == 400
    assert b"not JSON" in body


@pytest.mark.integration
async def test_floor_with_mget_reads_redis_once_per_request(
    redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("FLOOR_REDIS_PREFIX", redis_prefix)
    app = create_mget_app()
    probe = aioredis.Redis.from_url(redis_url)
    try:
        async with lifespan(app):
            status, body = await post(app, "/v1/runtimes/rt-9/claim", b'{"worker_id": "w"}')
            clients = await probe.client_list()
        mine = [c for c in clients if c.get("name") == f"{redis_prefix}-floor"]
        assert (status, orjson.loads(body)) == (200, {"tasks": []})
        assert [c["cmd"] for c in mine] == ["mget"]
    finally:
        await probe.aclose()
