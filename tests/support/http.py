"""Requests to a running gateway (a `tests.support.gateways.Instance`) and their answers."""

from __future__ import annotations

import asyncio
import io
from dataclasses import dataclass
from typing import Any

import orjson

from tests.support.gateways import TOKEN, Instance


@dataclass
class Resp:
    status: int
    headers: Any  # multidict of the response headers
    body: Any

    @property
    def content_type(self) -> str:
        return str(self.headers.get("Content-Type", "")).split(";")[0].strip()


_NOTHING = object()


async def req(
    inst: Instance,
    method: str,
    path: str,
    body: Any = _NOTHING,
    *,
    raw: Any = None,
    headers: dict[str, str] | None = None,
    auth: str | None = TOKEN,
) -> Resp:
    """One HTTP request with status, headers and the decoded JSON body. `raw` sends
    bytes (or an async iterator, chunked) instead of JSON; `auth=None` sends no
    Authorization header."""
    sent: dict[str, str] = {}
    if auth is not None:
        sent["Authorization"] = f"Bearer {auth}"
    kwargs: dict[str, Any] = {}
    if isinstance(raw, bytes):
        # From a file object, as aiohttp asks of bodies over 1 MiB (it warns otherwise);
        # the wire is the same: the body with its Content-Length.
        kwargs["data"] = io.BytesIO(raw)
        sent["Content-Type"] = "application/json"
    elif raw is not None:
        kwargs["data"] = raw
        sent["Content-Type"] = "application/json"
    elif body is not _NOTHING:
        kwargs["data"] = orjson.dumps(body)
        sent["Content-Type"] = "application/json"
    sent.update(headers or {})
    async with inst.http.request(method, inst.url + path, headers=sent, **kwargs) as resp:
        text = await resp.read()
        try:
            body = orjson.loads(text) if text else None
        except orjson.JSONDecodeError:
            body = text.decode(errors="replace")  # kept for the assertion message
        return Resp(resp.status, resp.headers, body)


async def req_past_busy(
    inst: Instance, method: str, path: str, body: Any = _NOTHING, *, tries: int = 20
) -> Resp:
    """`req`, sent again after its Retry-After while the database's line refuses it
    (503 database_busy), as a client does: many requests at once on a slow machine may
    meet that refusal, which is the admission control working, not the test's subject."""
    for _ in range(tries - 1):
        answer = await req(inst, method, path, body)
        busy = isinstance(answer.body, dict) and answer.body.get("code") == "database_busy"
        if answer.status != 503 or not busy:
            return answer
        await asyncio.sleep(float(answer.headers.get("Retry-After", "1")))
    return await req(inst, method, path, body)


async def call_ok(inst: Instance, method: str, path: str, body: Any = None) -> Any:
    """The decoded body of an answer that must be 200."""
    status, data = await inst.call(method, path, body)
    assert status == 200, (status, data)
    return data


async def get_task(inst: Instance, task_id: str) -> dict[str, Any]:
    resp = await req(inst, "GET", f"/v1/tasks/{task_id}")
    assert resp.status == 200, (resp.status, resp.body)
    return dict(resp.body)
