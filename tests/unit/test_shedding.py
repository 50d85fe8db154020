"""The door (gateway/http/shedding.py): which requests it refuses while the database's
line is full (work: enqueues, signed webhooks, reads; never a claim, a report on a
claimed task, a control, a probe or the metrics), and its one answer, the problem the
line itself would answer."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.admission import Admission
from gateway.http.io import HOLD_READING
from gateway.http.routes import ENDPOINTS
from gateway.http.shedding import Shedding
from gateway.metrics import Metrics


def door() -> Shedding:
    return Shedding(ENDPOINTS, Admission(2, 250.0, 5000.0, Metrics()).refusal())


def scope(method: str, path: str) -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path, "headers": []}


def test_work_is_refused_at_the_door_and_nothing_else_is() -> None:
    shedding = door()
    refused = [
        ("POST", "/v1/runtimes/rt-1/tasks"),
        ("POST", "/v1/runtimes/rt-1/tasks:batch"),
        ("POST", "/v1/runtimes/rt-1/webhooks"),
        ("GET", "/v1/runtimes/rt-1/tasks"),
        ("GET", "/v1/runtimes/rt-1/stats"),
        ("GET", "/v1/tasks/0198f3a0-0000-7000-8000-000000000000"),
    ]
    let_in = [
        ("POST", "/v1/runtimes/rt-1/claim"),
        ("POST", "/v1/tasks/0198f3a0-0000-7000-8000-000000000000/complete"),
        ("POST", "/v1/tasks:complete"),
        ("POST", "/v1/tasks/0198f3a0-0000-7000-8000-000000000000/heartbeat"),
        ("POST", "/v1/runtimes/rt-1:pause"),
        ("GET", "/healthz"),
        ("GET", "/readyz"),
        ("GET", "/metrics"),
        ("GET", "/console"),
        ("DELETE", "/v1/runtimes/rt-1/tasks"),
    ]
    assert [r for r in refused if not shedding.refuses(scope(*r))] == []
    assert [r for r in let_in if shedding.refuses(scope(*r))] == []


async def test_the_answer_is_the_lines_own_refusal() -> None:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    request = scope("POST", "/v1/runtimes/rt-1/tasks")
    await door().answer(request, receive, send)
    start, body = sent
    headers = dict(start["headers"])
    assert start["status"] == 503 and headers[b"retry-after"] == b"1"
    assert headers[b"content-type"] == b"application/problem+json"
    problem = orjson.loads(body["body"])
    assert problem["code"] == "database_busy"
    assert "GATEWAY_DB_QUEUE_BUDGET_MS" in problem["detail"]
    assert request[HOLD_READING] == 1.0  # the connection is read again a second later
