"""A task's life through the HTTP API, as the e2e tests drive and check it: enqueue,
claim, lease operations and listings, each asserting its answer's status; RFC 9457
problem answers and RFC 3339 times checked as design sections 4 and 5 require.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from tests.support.gateways import Instance
from tests.support.http import Resp, req

# RFC 3339 UTC with microseconds and a Z, as design section 5 requires.
TIME_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
STATUSES = ("queued", "claimed", "completed", "dead", "expired", "cancelled")
UNKNOWN_TASK = "00000000-0000-4000-8000-000000000000"
RANDOM_LEASE = "11111111-2222-4333-8444-555555555555"


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
