"""Signed enqueue: Standard Webhooks deliveries, signed by the reference library
(`standardwebhooks`), become tasks; every refusal stores nothing."""

from __future__ import annotations

import asyncio
import base64
import secrets
from datetime import UTC, datetime, timedelta

import orjson
import pytest
import pytest_asyncio

from tests.support.credentials import deliver, make_secret, shifted, sign, unique
from tests.support.databases import rows
from tests.support.http import req
from tests.support.lifecycle import (
    all_tasks,
    assert_problem,
    claim,
    claim_one,
)

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.integration]

EVENT = {
    "type": "build.requested",
    "timestamp": "2026-11-25T21:02:03Z",
    "data": {"sha": "abc", "n": [1, 2.5, None, True]},
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def hooks(gw):
    """A runtime family `hk-<tag>-*` with one secret, and a second runtime's secret."""
    tag = secrets.token_hex(3)
    mine = await make_secret(gw, [f"hk-{tag}-*"])
    other = await make_secret(gw, [f"other-{tag}"])
    return {"tag": tag, "secret": mine["secret"], "other": other["secret"]}


@pytest.fixture
def rt(hooks):
    return f"hk-{hooks['tag']}-{secrets.token_hex(3)}"


async def nothing_stored(gw, rt, msg_id=None):
    assert await all_tasks(gw, rt) == []
    if msg_id is not None:
        key = "webhook:" + msg_id
        assert await rows(gw, "SELECT id FROM tasks WHERE idempotency_key = $1", key) == []


def replayed(resp) -> bool:
    return resp.headers.get("Idempotent-Replayed") == "true"


async def test_a_signed_delivery_becomes_a_task_with_that_payload(gw, hooks, rt):
    resp = await deliver(gw, rt, EVENT, secret=hooks["secret"])
    assert resp.status == 201, resp.body
    assert not replayed(resp)
    task = resp.body
    assert (task["runtime_id"], task["payload"], task["status"]) == (rt, EVENT, "queued")
    assert (task["priority"], task["max_attempts"]) == (50, 5)
    claimed = await claim_one(gw, rt)
    assert (claimed["id"], claimed["payload"]) == (task["id"], EVENT)


async def test_a_redelivery_is_a_replay(gw, hooks, rt):
    raw = orjson.dumps(EVENT)
    headers = sign(hooks["secret"], raw, msg_id="msg_replay")
    first = await deliver(gw, rt, raw, headers)
    assert first.status == 201, first.body
    # Standard Webhooks retries re-sign with a new timestamp and keep the id.
    again = await deliver(gw, rt, raw, sign(hooks["secret"], raw, "msg_replay", shifted(-60)))
    assert (again.status, replayed(again), again.body["id"]) == (200, True, first.body["id"])
    assert len(await all_tasks(gw, rt)) == 1
    other = orjson.dumps({**EVENT, "data": {}})
    reused = await deliver(gw, rt, other, sign(hooks["secret"], other, "msg_replay"))
    assert_problem(reused, 422, "idempotency_key_reused")
    assert [t["payload"] for t in await all_tasks(gw, rt)] == [EVENT]


async def test_rotation_any_of_several_signatures_may_match(gw, hooks, rt):
    raw = orjson.dumps(EVENT)
    good = sign(hooks["secret"], raw, "msg_rot")
    stale_key = sign("whsec_" + base64.b64encode(b"k" * 32).decode(), raw, "msg_rot")
    both = f"{stale_key['webhook-signature']} {good['webhook-signature']}"
    resp = await deliver(gw, rt, raw, {**good, "webhook-signature": both})
    assert resp.status == 201, resp.body


async def test_any_live_secret_covering_the_runtime_may_sign(gw, hooks, rt):
    exact = await make_secret(gw, [rt])
    for secret in (exact["secret"], hooks["secret"]):
        resp = await deliver(gw, rt, EVENT, secret=secret)
        assert resp.status == 201, resp.body


async def test_query_parameters_set_the_enqueue_options(gw, hooks, rt):
    query = "?priority=7&max_attempts=2&delay_seconds=30&ttl_seconds=600.5"
    resp = await deliver(gw, rt, EVENT, secret=hooks["secret"], query=query)
    assert resp.status == 201, resp.body
    task = resp.body
    assert (task["priority"], task["max_attempts"]) == (7, 2)
    run_at = datetime.fromisoformat(task["run_at"])
    assert run_at > datetime.now(UTC) + timedelta(seconds=25)
    expires = datetime.fromisoformat(task["expires_at"])
    assert abs((expires - run_at).total_seconds() - 600.5) < 0.01


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("?priority=1001", "priority"),
        ("?priority=high", "priority"),
        ("?priority=1e3", "priority"),
        ("?priority=", "priority"),
        ("?priority=1&priority=2", "priority"),
        ("?max_attempts=0", "max_attempts"),
        ("?max_attempts=1.5", "max_attempts"),
        ("?delay_seconds=-1", "delay_seconds"),
        ("?ttl_seconds=0", "ttl_seconds"),
        ("?ttl_seconds=nan", "ttl_seconds"),
        ("?idempotency_key=k", "idempotency_key"),
        ("?run_at=2030-01-01T00:00:00Z", "run_at"),
    ],
)
async def test_bad_query_parameters_are_422_naming_them(gw, hooks, rt, query, field):
    raw = orjson.dumps(EVENT)
    headers = sign(hooks["secret"], raw)
    resp = await deliver(gw, rt, raw, headers, query=query)
    assert_problem(resp, 422, "validation_failed", field)
    assert resp.body["field"] == field
    await nothing_stored(gw, rt, headers["webhook-id"])


@pytest.mark.parametrize(
    "when", [-301, 301, -3600, 86400], ids=["stale", "future", "an-hour-old", "tomorrow"]
)
async def test_a_timestamp_more_than_five_minutes_away_is_401(gw, hooks, rt, when):
    raw = orjson.dumps(EVENT)
    headers = sign(hooks["secret"], raw, when=shifted(when))
    resp = await deliver(gw, rt, raw, headers)
    assert_problem(resp, 401, "invalid_signature")
    assert "300 s" in resp.body["detail"]
    assert resp.headers["WWW-Authenticate"].startswith("Webhook-Signature")
    await nothing_stored(gw, rt, headers["webhook-id"])


async def test_a_timestamp_within_five_minutes_is_fine(gw, hooks, rt):
    for when in (-290, 290):
        raw = orjson.dumps(EVENT)
        resp = await deliver(gw, rt, raw, sign(hooks["secret"], raw, when=shifted(when)))
        assert resp.status == 201, resp.body


async def test_a_tampered_body_is_401(gw, hooks, rt):
    raw = orjson.dumps(EVENT)
    headers = sign(hooks["secret"], raw)
    tampered = raw.replace(b'"abc"', b'"abd"')
    assert tampered != raw
    assert_problem(await deliver(gw, rt, tampered, headers), 401, "invalid_signature")
    await nothing_stored(gw, rt, headers["webhook-id"])


async def test_a_secret_for_another_runtime_is_401(gw, hooks, rt):
    raw = orjson.dumps(EVENT)
    headers = sign(hooks["other"], raw)
    assert_problem(await deliver(gw, rt, raw, headers), 401, "invalid_signature")
    await nothing_stored(gw, rt, headers["webhook-id"])
    # ...and the runtime it does cover takes it.
    resp = await deliver(gw, f"other-{hooks['tag']}", raw, sign(hooks["other"], raw))
    assert resp.status == 201, resp.body


async def test_a_runtime_no_secret_covers_is_401(gw, hooks):
    rt = unique("nobody")
    raw = orjson.dumps(EVENT)
    resp = await deliver(gw, rt, raw, sign(hooks["secret"], raw))
    assert_problem(resp, 401, "invalid_signature")
    await nothing_stored(gw, rt)


@pytest.mark.parametrize(
    "change",
    [
        {"webhook-id": ""},
        {"webhook-timestamp": ""},
        {"webhook-signature": ""},
        {"webhook-timestamp": "soon"},
        {"webhook-timestamp": "1.7e9"},
        {"webhook-signature": "v1,!!!not-base64!!!"},
        {"webhook-signature": "v2,AAAA"},
        {"webhook-signature": "just-a-signature"},
        {"webhook-id": "msg_other"},
    ],
    ids=["no-id", "no-timestamp", "no-signature", "word-timestamp", "float-timestamp",
         "bad-base64", "other-version", "no-version", "other-id"],
)  # fmt: skip
async def test_malformed_or_mismatched_headers_are_401(gw, hooks, rt, change):
    raw = orjson.dumps(EVENT)
    headers = {**sign(hooks["secret"], raw, "msg_orig"), **change}
    headers = {k: v for k, v in headers.items() if v}
    assert_problem(await deliver(gw, rt, raw, headers), 401, "invalid_signature")
    await nothing_stored(gw, rt, "msg_orig")


async def test_a_bearer_token_is_no_substitute_for_a_signature(gw, rt):
    resp = await req(gw, "POST", f"/v1/runtimes/{rt}/webhooks", EVENT)  # admin bearer only
    assert_problem(resp, 401, "invalid_signature")
    await nothing_stored(gw, rt)


@pytest.mark.parametrize(
    "raw", [b"{not json", b"", b"   ", b"[1, 2"], ids=["broken", "empty", "blank", "unclosed"]
)
async def test_a_signed_body_that_is_not_json_is_400(gw, hooks, rt, raw):
    headers = sign(hooks["secret"], raw)
    assert_problem(await deliver(gw, rt, raw, headers), 400, "bad_request")
    await nothing_stored(gw, rt, headers["webhook-id"])


@pytest.mark.parametrize("raw", [b"[1, 2]", b'"text"', b"18446744073709551616"])
async def test_any_json_value_is_a_payload_kept_exactly(gw, hooks, rt, raw):
    headers = sign(hooks["secret"], raw)
    resp = await deliver(gw, rt, raw, headers)
    assert resp.status == 201, resp.body
    stored = await rows(gw, "SELECT payload::text AS p FROM tasks WHERE id = $1", resp.body["id"])
    assert orjson.loads(stored[0]["p"]) == orjson.loads(raw) and stored[0]["p"] == raw.decode()


async def test_a_signed_payload_nested_too_deeply_is_422(gw, hooks, rt):
    raw = b"[" * 65 + b"]" * 65
    headers = sign(hooks["secret"], raw)
    assert_problem(await deliver(gw, rt, raw, headers), 422, field="payload")
    await nothing_stored(gw, rt, headers["webhook-id"])


async def test_a_signed_payload_over_the_limit_is_413(gw, hooks, rt):
    big = {"blob": "x" * (gw.gateway.settings.max_payload_bytes + 1)}
    raw = orjson.dumps(big)
    headers = sign(hooks["secret"], raw)
    assert_problem(await deliver(gw, rt, raw, headers), 413, "payload_too_large")
    await nothing_stored(gw, rt, headers["webhook-id"])


async def test_an_overlong_webhook_id_is_422(gw, hooks, rt):
    raw = orjson.dumps(EVENT)
    headers = sign(hooks["secret"], raw, msg_id="m" * 193)
    assert_problem(await deliver(gw, rt, raw, headers), 422, "validation_failed", "webhook-id")
    await nothing_stored(gw, rt)
    ok = await deliver(gw, rt, raw, sign(hooks["secret"], raw, msg_id="m" * 192))
    assert ok.status == 201, ok.body


async def test_a_webhook_id_never_meets_a_producers_idempotency_key(gw, hooks, rt):
    produced = await req(
        gw, "POST", f"/v1/runtimes/{rt}/tasks", {"payload": 1}, headers={"Idempotency-Key": "k1"}
    )
    assert produced.status == 201
    raw = orjson.dumps(EVENT)
    resp = await deliver(gw, rt, raw, sign(hooks["secret"], raw, msg_id="k1"))
    assert resp.status == 201 and resp.body["id"] != produced.body["id"]


async def test_a_delivery_wakes_a_parked_poll(gw, hooks, rt):
    poll = asyncio.create_task(claim(gw, rt, wait_seconds=10))
    await asyncio.sleep(0.3)
    resp = await deliver(gw, rt, EVENT, secret=hooks["secret"])
    assert resp.status == 201
    tasks = await asyncio.wait_for(poll, 5)
    assert [t["id"] for t in tasks] == [resp.body["id"]]


async def test_secrets_are_read_once_per_runtime_per_cache_period(gw, hooks, rt, monkeypatch):
    verifier = gw.gateway.webhooks
    loads: list[str] = []
    real = verifier._keys_for

    async def counting(runtime_id: str) -> tuple[bytes, ...]:
        loads.append(runtime_id)
        return await real(runtime_id)

    monkeypatch.setattr(verifier, "_keys_for", counting)
    verifier.cache.clear()
    results = await asyncio.gather(
        *(deliver(gw, rt, {"n": n}, secret=hooks["secret"]) for n in range(20))
    )
    assert [r.status for r in results] == [201] * 20
    assert loads == [rt]  # 20 concurrent deliveries, one read of Postgres
