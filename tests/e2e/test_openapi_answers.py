"""Answers the fuzzer cannot provoke (replays, lost leases, every task state, a task
that cannot be shown, limits, overload, shutdown), each checked against the OpenAPI
document with the same schemathesis checks as the fuzzing."""

from __future__ import annotations

import secrets
import time
from typing import Any

import pytest
import requests
import schemathesis

from gateway.api import decode, render
from tests.support.gateways import Served, gateway_thread
from tests.support.openapi import AUTH, OVERRIDES, check, document
from tests.support.redis_keys import new_prefix

LIMITS: dict[str, Any] = {**OVERRIDES, "max_payload_bytes": 1000, "max_body_bytes": 100_000}
SCHEMA = schemathesis.openapi.from_dict(document(**LIMITS))
ENQUEUE = "/v1/runtimes/{rt}/tasks"
BATCH = "/v1/runtimes/{rt}/tasks:batch"
CLAIM = "/v1/runtimes/{rt}/claim"
TASK = "/v1/tasks/{task_id}"


@pytest.fixture(scope="module")
def served_options() -> dict[str, Any]:
    return LIMITS


class Client:
    """Calls one gateway and checks every answer against the operation it names."""

    def __init__(self, served: Served) -> None:
        self.base = served.url
        self.runtime = "answers-" + secrets.token_hex(6)

    def call(
        self,
        method: str,
        template: str,
        body: Any = None,
        *,
        task: str = "",
        rt: str = "",
        headers: dict[str, str] | None = None,
        **kw: Any,
    ) -> requests.Response:
        params = {"rt": rt or self.runtime, "task_id": task}
        path = template.replace("{rt}", params["rt"]).replace("{task_id}", task)
        resp = requests.request(
            method,
            self.base + path,
            json=body,
            headers={**AUTH, **(headers or {})},
            timeout=30,
            **kw,
        )
        check(SCHEMA, method, template, resp, {k: v for k, v in params.items() if k in template})
        return resp

    def enqueue(self, **fields: Any) -> dict[str, Any]:
        resp = self.call("POST", ENQUEUE, {"payload": {"n": 1}, **fields})
        assert resp.status_code == 201, resp.text
        return dict(resp.json())

    def claim(self, **fields: Any) -> dict[str, Any]:
        resp = self.call("POST", CLAIM, {"worker_id": "w", **fields})
        assert resp.status_code == 200, resp.text
        return dict(resp.json()["tasks"][0])

    def lease_op(self, op: str, task: dict[str, Any], **fields: Any) -> requests.Response:
        body = {"lease_id": task["lease_id"], **fields}
        return self.call("POST", f"{TASK}/{op}", body, task=task["id"])


def test_replays_and_reused_keys(served: Served) -> None:
    c = Client(served)
    c.enqueue(idempotency_key="k")
    replay = c.call("POST", ENQUEUE, {"payload": {"n": 1}}, headers={"Idempotency-Key": "k"})
    assert (replay.status_code, replay.headers["Idempotent-Replayed"]) == (200, "true")
    assert c.call("POST", ENQUEUE, {"payload": 2, "idempotency_key": "k"}).status_code == 422
    batch = {"tasks": [{"payload": 1, "idempotency_key": "b1"}, {"payload": 2}]}
    assert c.call("POST", BATCH, batch).status_code == 201
    only_keys = {"tasks": [{"payload": 1, "idempotency_key": "b1"}]}
    assert c.call("POST", BATCH, only_keys).headers["Idempotent-Replayed"] == "true"
    reused = c.call("POST", BATCH, {"tasks": [{"payload": 9, "idempotency_key": "b1"}]})
    assert (reused.status_code, reused.json()["index"]) == (422, 0)
    bad_item = c.call("POST", BATCH, {"tasks": [{"payload": 1}, {"priority": 5}]})
    assert bad_item.json()["field"] == "tasks[1].payload"


def test_minimal_answers_and_replays(served: Served) -> None:
    c = Client(served)
    minimal = {"Prefer": "return=minimal", "Idempotency-Key": "m"}
    for status in (201, 200):  # new, then a replay
        one = c.call("POST", ENQUEUE, {"payload": 1}, headers=minimal)
        assert one.status_code == status and list(one.json()) == ["id"], one.text
        assert one.headers["Preference-Applied"] == "return=minimal"
    batch = {"tasks": [{"payload": 1, "idempotency_key": "mb"}, {"payload": {"n": 2}}]}
    minimal_batch = {"Prefer": "return=minimal"}
    made = c.call("POST", BATCH, batch, headers=minimal_batch)
    assert made.status_code == 201 and len(made.json()["tasks"]) == 2, made.text
    replay = c.call("POST", BATCH, {"tasks": batch["tasks"][:1]}, headers=minimal_batch)
    assert replay.status_code == 200 and replay.json()["tasks"] == made.json()["tasks"][:1]


def test_every_task_state(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    c = Client(served)
    delayed = c.enqueue(delay_seconds=3600, ttl_seconds=60)
    assert c.call("GET", TASK, task=delayed["id"]).json()["status"] == "queued"
    c.enqueue(payload={"big": 18446744073709551616})
    done = c.claim()
    assert c.lease_op("heartbeat", done, lease_seconds=30).json()["cancel_requested"] is False
    completed = c.lease_op("complete", done, result={"exact": 0.10000000000000000001})
    assert completed.json()["status"] == "completed"
    assert c.lease_op("complete", done).status_code == 200  # repeated with the same lease
    lost = c.lease_op("heartbeat", done)
    assert (lost.status_code, lost.json()["task_status"]) == (409, "completed")
    assert c.call("POST", f"{TASK}/cancel", task=done["id"]).status_code == 409

    c.enqueue(max_attempts=1)
    dead = c.claim()
    assert c.lease_op("fail", dead, error="boom").json()["status"] == "dead"
    assert c.call("POST", f"{TASK}/retry", task=dead["id"]).json()["status"] == "queued"
    assert c.claim()["id"] == dead["id"]
    c.enqueue()
    backoff = c.claim()
    requeued = c.lease_op("fail", backoff, error="again", retry_after_seconds=3600).json()
    assert (requeued["status"], requeued["last_error"]) == ("queued", "again")
    assert c.call("POST", f"{TASK}/retry", task=backoff["id"]).status_code == 409
    c.enqueue()
    held = c.claim()
    cancelling = c.call("POST", f"{TASK}/cancel", task=held["id"]).json()
    assert cancelling["cancel_requested"] is True
    assert c.lease_op("release", held).json()["status"] == "cancelled"

    expiring = c.enqueue(ttl_seconds=1)
    time.sleep(1.2)
    assert c.call("GET", TASK, task=expiring["id"]).json()["status"] == "expired"

    poison = c.enqueue(payload={"poison": True})
    real = render.task_bytes

    def broken(row: Any) -> Any:
        if row.id == decode.check_task_id(poison["id"]):
            raise ValueError("this row cannot be written")
        return real(row)

    monkeypatch.setattr(render, "task_bytes", broken)
    stub = c.call("GET", TASK, task=poison["id"]).json()
    assert stub["render_error"] and stub["payload"] is None


def test_listing_and_stats(served: Served) -> None:
    c = Client(served)
    for _ in range(3):
        c.enqueue()
    page = c.call("GET", ENQUEUE, params={"limit": "2"}).json()
    assert page["next_cursor"] is not None
    last = c.call("GET", ENQUEUE, params={"cursor": page["next_cursor"]}).json()
    assert last["next_cursor"] is None and len(last["tasks"]) == 1
    assert c.call("GET", ENQUEUE, params={"cursor": "nope"}).status_code == 422
    stats = c.call("GET", "/v1/runtimes/{rt}/stats").json()
    assert stats["counts"]["queued"] == 3
    assert c.call("POST", CLAIM, {"worker_id": "w", "wait_seconds": 0.1}).status_code == 200


def test_token_and_runtime_pages(served: Served) -> None:
    """The paged admin and runtimes listings, with and without a next_cursor."""
    c = Client(served)
    for _ in range(2):
        made = c.call(
            "POST", "/v1/admin/tokens", {"name": "ans-" + secrets.token_hex(4), "scopes": ["read"]}
        )
        assert made.status_code == 201, made.text
    page = c.call("GET", "/v1/admin/tokens", params={"limit": "1"}).json()
    assert len(page["tokens"]) == 1 and page["next_cursor"] is not None
    params = {"limit": "1000", "cursor": page["next_cursor"], "include_revoked": "true"}
    assert c.call("GET", "/v1/admin/tokens", params=params).status_code == 200
    bad = c.call("GET", "/v1/admin/tokens", params={"cursor": "nope"})
    assert (bad.status_code, bad.json()["field"]) == (422, "cursor")
    for rt in (c.runtime, c.runtime + "-2"):
        assert c.call("POST", ENQUEUE, {"payload": 1}, rt=rt).status_code == 201
    runtimes = c.call("GET", "/v1/runtimes", params={"limit": "1"}).json()
    assert runtimes["next_cursor"] is not None
    rest = c.call("GET", "/v1/runtimes", params={"cursor": runtimes["next_cursor"]})
    assert rest.status_code == 200 and rest.json()["runtimes"]
    forged = c.call("GET", "/v1/runtimes", params={"cursor": "YQ"})  # base64 of "a"
    assert (forged.status_code, forged.json()["field"]) == (422, "cursor")


def test_refusals(served: Served) -> None:
    c = Client(served)
    assert c.call("POST", ENQUEUE, data=b"{").status_code == 400
    # Regression: was 503 store_unavailable (the lone surrogate reached Postgres).
    surrogate = b'{"big": 1e400, "worker_id": "\\ud800"}'
    assert c.call("POST", CLAIM, data=surrogate).status_code == 400
    assert c.call("POST", ENQUEUE, {"payload": "x" * 2000}).status_code == 413
    assert c.call("POST", ENQUEUE, {"payload": 1, "pad": "x" * 200_000}).status_code == 413
    assert c.call("POST", ENQUEUE, {"payload": 1}, rt="not%20an%20id").status_code == 422
    assert c.call("GET", "/v1/runtimes/{rt}/stats", rt="a%2Fb").status_code == 404
    assert c.call("GET", TASK, task="00000000-0000-4000-8000-000000000000").status_code == 404
    for token in ("", "Bearer wrong-token"):
        unauthorized = c.call("GET", TASK, task="x", headers={"Authorization": token})
        assert unauthorized.status_code == 401 and unauthorized.headers["WWW-Authenticate"]
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
        assert c.call("GET", path, headers={"Authorization": ""}).status_code == 200


def test_overload_and_shutdown(database_url: str, redis_url: str) -> None:
    with gateway_thread(
        database_url=database_url, redis_url=redis_url, prefix=new_prefix(), max_parked_polls=0
    ) as served:
        c = Client(served)
        overloaded = c.call("POST", CLAIM, {"worker_id": "w", "wait_seconds": 1})
        assert (overloaded.status_code, overloaded.json()["code"]) == (429, "overloaded")
        assert int(overloaded.headers["Retry-After"]) > 0
        served.loop.call_soon_threadsafe(served.gateway.claimer.drain)
        time.sleep(0.1)
        draining = c.call("POST", CLAIM, {"worker_id": "w"})
        assert (draining.status_code, draining.json()["code"]) == (503, "draining")
        not_ready = c.call("GET", "/readyz")
        assert (not_ready.status_code, not_ready.json()["status"]) == (503, "not ready")
