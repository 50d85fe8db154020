"""Shared helpers for the lifecycle e2e tests (design sections 4 and 5).

This module holds no tests. It is named test_lifecycle_* only because the lifecycle
suite may only add files under that name; the other test_lifecycle_* modules import it.

Each module runs one gateway for all its tests (a module-scoped fixture on the
module's event loop); tests isolate by runtime id. A janitor pass touches the whole
database, so tests check the state of their own tasks, not the pass's counts.
"""

from __future__ import annotations

import contextlib
import re
import secrets
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import aiohttp

from tests.harness import Instance, make_settings, running_gateway
from tests.support.http import Resp, req

# RFC 3339 UTC with microseconds and a Z, as design section 5 requires.
TIME_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
STATUSES = ("queued", "claimed", "completed", "dead", "expired", "cancelled")
UNKNOWN_TASK = "00000000-0000-4000-8000-000000000000"
RANDOM_LEASE = "11111111-2222-4333-8444-555555555555"


@contextlib.asynccontextmanager
async def gateway(database_url: str, redis_url: str, **overrides: Any) -> AsyncIterator[Instance]:
    """A gateway with a Redis prefix of its own, whose janitor runs once at start-up and
    then not for an hour, so that a test decides when the janitor passes
    (`inst.gateway.janitor.run_once()`).

    Its HTTP session opens a connection per request: a server that closes a connection
    after an error answer must not break the next test's request on a pooled socket."""
    overrides.setdefault("janitor_interval_seconds", 3600)
    prefix = "gwt" + secrets.token_hex(4)
    settings = make_settings(database_url, redis_url, prefix, **overrides)
    async with running_gateway(settings) as gw:
        connector = aiohttp.TCPConnector(limit=500, force_close=True)
        async with aiohttp.ClientSession(connector=connector) as http:
            yield Instance(gw.url, gw.gateway, http)


def assert_problem(
    resp: Resp, status: int, code: str | None = None, field: str | None = None
) -> dict[str, Any]:
    """An RFC 9457 problem answer with `status`, optionally `code` and naming `field`."""
    assert resp.status == status, (resp.status, resp.body)
    assert resp.content_type == "application/problem+json", resp.headers
    body = resp.body
    assert isinstance(body, dict), body
    for key in ("status", "title", "detail", "code"):
        assert key in body, (key, body)
    assert body["status"] == status, body
    assert isinstance(body["title"], str) and body["title"], body
    assert isinstance(body["detail"], str) and body["detail"], body
    assert isinstance(body["code"], str) and body["code"], body
    if code is not None:
        assert body["code"] == code, body
    if field is not None:
        assert body.get("field") == field or field in body["detail"], (field, body)
    return body


def assert_task_times(task: dict[str, Any]) -> None:
    for key in ("run_at", "created_at", "updated_at", "expires_at", "lease_expires_at"):
        value = task.get(key)
        if value is not None:
            assert TIME_RE.match(value), (key, value)


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


async def enqueue(inst: Instance, rt: str, payload: Any = None, **fields: Any) -> dict[str, Any]:
    resp = await req(inst, "POST", f"/v1/runtimes/{rt}/tasks", {"payload": payload, **fields})
    assert resp.status == 201, (resp.status, resp.body)
    return resp.body


async def claim(inst: Instance, rt: str, worker: str = "w", **fields: Any) -> list[dict[str, Any]]:
    resp = await req(inst, "POST", f"/v1/runtimes/{rt}/claim", {"worker_id": worker, **fields})
    assert resp.status == 200, (resp.status, resp.body)
    assert resp.content_type == "application/json", resp.headers
    return resp.body["tasks"]


async def claim_one(inst: Instance, rt: str, **fields: Any) -> dict[str, Any]:
    tasks = await claim(inst, rt, **fields)
    assert len(tasks) == 1, tasks
    return tasks[0]


async def lease_op(
    inst: Instance, op: str, task: dict[str, Any], lease_id: str | None = None, **fields: Any
) -> Resp:
    """POST /v1/tasks/{id}/{op} with the task's lease (or the given one)."""
    body = {"lease_id": lease_id or task["lease_id"], **fields}
    return await req(inst, "POST", f"/v1/tasks/{task['id']}/{op}", body)


async def list_tasks(inst: Instance, rt: str, query: str = "") -> Resp:
    return await req(inst, "GET", f"/v1/runtimes/{rt}/tasks{query}")


async def all_tasks(inst: Instance, rt: str) -> list[dict[str, Any]]:
    """Every task of a runtime, following next_cursor."""
    out: list[dict[str, Any]] = []
    cursor = None
    for _ in range(100):
        query = "?limit=1000" + (f"&cursor={cursor}" if cursor else "")
        resp = await list_tasks(inst, rt, query)
        assert resp.status == 200, (resp.status, resp.body)
        out.extend(resp.body["tasks"])
        cursor = resp.body["next_cursor"]
        if cursor is None:
            return out
    raise AssertionError("listing never ended")
