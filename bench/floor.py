"""The bare Starlette floor: what any Starlette + uvicorn service costs per request on
this machine, with nothing of the gateway in it.

`create_app` parses the JSON body and answers JSON, with no I/O. `create_mget_app`
does the same plus one redis-py `MGET` of two keys per request (under the run's prefix,
`FLOOR_REDIS_PREFIX`, on `REDIS_URL`). The harness starts each with the gateway's own
uvicorn flags (`--loop uvloop --http httptools --no-access-log`) as a separate process.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
import redis.asyncio as aioredis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

EMPTY_ANSWER = orjson.dumps({"tasks": []})


def _answer(body: bytes) -> Response:
    return Response(body, media_type="application/json")


async def _parse(request: Request) -> Response | None:
    """The body as the gateway would take it: JSON or a 400."""
    try:
        orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        return Response(b'{"detail":"body is not JSON"}', 400, media_type="application/json")
    return None


async def _claim(request: Request) -> Response:
    return await _parse(request) or _answer(EMPTY_ANSWER)


async def _health(request: Request) -> Response:
    return _answer(b'{"status":"ok"}')


def create_app() -> Starlette:
    """Parse the JSON body, answer `{"tasks": []}`; no I/O at all."""
    return Starlette(
        routes=[
            Route("/v1/runtimes/{rt}/claim", _claim, methods=["POST"]),
            Route("/healthz", _health),
            Route("/readyz", _health),
        ]
    )


def create_mget_app() -> Starlette:
    """As `create_app`, plus one MGET of two keys per request: a verdict read's floor."""
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    prefix = os.environ.get("FLOOR_REDIS_PREFIX", "benchfloor")
    # Named, so that the run's connections can be told apart in CLIENT LIST.
    client = aioredis.Redis.from_url(url, client_name=f"{prefix}-floor")

    async def claim(request: Request) -> Response:
        refused = await _parse(request)
        if refused is not None:
            return refused
        rt = request.path_params["rt"]
        await client.mget(f"{prefix}:v:{rt}", f"{prefix}:e:{rt}")
        return _answer(EMPTY_ANSWER)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await client.ping()
        yield
        await client.aclose()

    return Starlette(
        routes=[
            Route("/v1/runtimes/{rt}/claim", claim, methods=["POST"]),
            Route("/healthz", _health),
            Route("/readyz", _health),
        ],
        lifespan=lifespan,
    )
