"""Credentials for the token, webhook and isolation tests: tokens and webhook secrets
made through the admin API, Standard Webhooks deliveries signed by the reference
library, and snapshots of the tables a refused request must leave as they were."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from standardwebhooks.webhooks import Webhook

from tests.support.databases import rows
from tests.support.gateways import Instance
from tests.support.http import Resp, req


def unique(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


async def make_token(
    inst: Instance, scopes: list[str], runtimes: list[str] | None = None, name: str | None = None
) -> dict[str, Any]:
    """A token made through the admin API: its JSON, with the secret in `token`."""
    body: dict[str, Any] = {"name": name or unique("tok"), "scopes": scopes}
    if runtimes is not None:
        body["runtimes"] = runtimes
    resp = await req(inst, "POST", "/v1/admin/tokens", body)
    assert resp.status == 201, (resp.status, resp.body)
    return resp.body


async def every_token(
    inst: Instance, query: str = "", limit: int = 1000
) -> tuple[list[dict[str, Any]], list[int]]:
    """Every token GET /v1/admin/tokens lists (`query`: more parameters), following
    next_cursor, and the size of each page."""
    tokens: list[dict[str, Any]] = []
    sizes: list[int] = []
    cursor = None
    for _ in range(10_000):
        path = f"/v1/admin/tokens?limit={limit}{query}" + (f"&cursor={cursor}" if cursor else "")
        resp = await req(inst, "GET", path)
        assert resp.status == 200, (resp.status, resp.body)
        tokens += resp.body["tokens"]
        sizes.append(len(resp.body["tokens"]))
        cursor = resp.body["next_cursor"]
        if cursor is None:
            return tokens, sizes
    raise AssertionError("the token listing never ended")


async def make_secret(inst: Instance, runtimes: list[str]) -> dict[str, Any]:
    """A webhook secret made through the admin API: its JSON, with `secret`."""
    body = {"name": unique("whs"), "runtimes": runtimes}
    resp = await req(inst, "POST", "/v1/admin/webhook-secrets", body)
    assert resp.status == 201, (resp.status, resp.body)
    return resp.body


def sign(
    secret: str, body: bytes, msg_id: str | None = None, when: datetime | None = None
) -> dict[str, str]:
    """Standard Webhooks headers for `body`, signed by the reference implementation."""
    msg_id = msg_id or "msg_" + secrets.token_hex(8)
    when = when or datetime.now(UTC)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(when.timestamp())),
        "webhook-signature": Webhook(secret).sign(msg_id, when, body.decode()),
    }


def shifted(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


async def deliver(
    inst: Instance,
    runtime: str,
    body: bytes | Any,
    headers: dict[str, str] | None = None,
    secret: str | None = None,
    query: str = "",
) -> Resp:
    """POST a delivery to the runtime's webhook endpoint, without a bearer token. With
    `secret`, the body is signed (fresh id, current time) unless `headers` say more."""
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    sent = sign(secret, raw) if secret else {}
    sent.update(headers or {})
    path = f"/v1/runtimes/{runtime}/webhooks{query}"
    return await req(inst, "POST", path, raw=raw, headers=sent, auth=None)


async def snapshot(inst: Instance, runtime_prefix: str) -> dict[str, list[dict[str, Any]]]:
    """Every column of every row of the credentials and runtime controls tables, and of
    the tasks and schedules (with their ticks) of runtimes named `runtime_prefix`...: the
    tasks table is shared by the session's tests, and a janitor pass may change another
    test's leftover task (a lease running out, a retry coming due) between two
    snapshots."""
    tasks = await rows(
        inst, "SELECT * FROM tasks WHERE starts_with(runtime_id, $1) ORDER BY id", runtime_prefix
    )
    schedules = await rows(
        inst,
        "SELECT * FROM schedules WHERE starts_with(runtime_id, $1) ORDER BY id",
        runtime_prefix,
    )
    ticks = await rows(
        inst,
        "SELECT k.* FROM schedule_ticks k JOIN schedules s ON s.id = k.schedule_id "
        "WHERE starts_with(s.runtime_id, $1) ORDER BY k.schedule_id, k.tick_at",
        runtime_prefix,
    )
    return {
        "tasks": tasks,
        "schedules": schedules,
        "schedule_ticks": ticks,
        **{
            table: await rows(inst, f"SELECT * FROM {table} ORDER BY {order}")
            for table, order in (
                ("api_tokens", "id"),
                ("webhook_secrets", "id"),
                ("runtime_controls", "runtime_id"),
            )
        },
    }
