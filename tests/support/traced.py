"""A real `gateway serve` exporting its spans to the tests' OTLP receiver
(tests/support/otlp.py), and an HTTP session on it with the admin token."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

from tests.support.gateways import TOKEN, serve_env, serve_process
from tests.support.otlp import Receiver, Span, receiver


class Traced:
    """A gateway exporting to `spans`, and a session on it with the admin token."""

    def __init__(self, spans: Receiver, http: aiohttp.ClientSession) -> None:
        self.spans = spans
        self.http = http

    async def post(
        self, path: str, body: Any, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        sent = {"Authorization": f"Bearer {TOKEN}", **(headers or {})}
        async with self.http.post(path, data=orjson.dumps(body), headers=sent) as resp:
            return resp.status, orjson.loads(await resp.read())

    async def get(self, path: str) -> Any:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with self.http.get(path, headers=headers) as resp:
            assert resp.status == 200
            return orjson.loads(await resp.read())

    async def server_span(self, trace_id: str, route: str) -> Span:
        [span] = await self.spans.wait_for(
            lambda s: (
                s.kind == "SERVER"
                and s.trace_id == trace_id
                and s.attributes.get("http.route") == route
            )
        )
        return span

    async def producers(self, parent_id: str, count: int = 1) -> list[Span]:
        return await self.spans.wait_for(
            lambda s: s.kind == "PRODUCER" and s.parent_id == parent_id, count
        )


@contextlib.asynccontextmanager
async def traced_gateway(
    database_url: str, redis_url: str, redis_prefix: str, **variables: str
) -> AsyncIterator[Traced]:
    """A gateway process on these servers, with these environment `variables` too,
    whose spans `Traced.spans` receives."""
    async with receiver() as spans:
        env = serve_env(database_url, redis_url, redis_prefix, **spans.env(), **variables)
        async with (
            serve_process(env=env) as (_, base),
            aiohttp.ClientSession(base_url=base) as http,
        ):
            yield Traced(spans, http)
