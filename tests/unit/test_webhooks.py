"""Standard Webhooks verification without a server: headers, tolerance, signatures."""

from __future__ import annotations

import base64
import hashlib
import hmac
from datetime import UTC, datetime

import pytest
from standardwebhooks.webhooks import Webhook
from starlette.datastructures import QueryParams

from gateway.api.requests import query_fields
from gateway.auth.webhooks import TOLERANCE_SECONDS, Verifier, parse_headers
from gateway.errors import InvalidSignature, ValidationFailed

NOW = 1_800_000_000
KEY = bytes(range(32))
SECRET = "whsec_" + base64.b64encode(KEY).decode()
BODY = b'{"type":"ping"}'


def headers(msg_id: str = "msg_1", ts: int = NOW, body: bytes = BODY) -> dict[str, str]:
    signature = Webhook(SECRET).sign(msg_id, datetime.fromtimestamp(ts, UTC), body.decode())
    return {"webhook-id": msg_id, "webhook-timestamp": str(ts), "webhook-signature": signature}


def verifier(*keys: bytes) -> tuple[Verifier, list[str]]:
    loads: list[str] = []

    async def keys_for(runtime_id: str) -> tuple[bytes, ...]:
        loads.append(runtime_id)
        return keys

    return Verifier(keys_for, clock=lambda: NOW), loads


@pytest.mark.parametrize("offset", [0, TOLERANCE_SECONDS, -TOLERANCE_SECONDS])
async def test_timestamps_within_tolerance_verify(offset):
    check, _ = verifier(KEY)
    sent = headers(ts=NOW + offset)
    await check.verify("rt", parse_headers(sent, NOW), BODY)


@pytest.mark.parametrize("offset", [TOLERANCE_SECONDS + 1, -TOLERANCE_SECONDS - 1])
def test_timestamps_beyond_tolerance_are_refused_before_any_lookup(offset):
    with pytest.raises(InvalidSignature, match="300 s"):
        parse_headers(headers(ts=NOW + offset), NOW)


async def test_any_v1_signature_of_several_may_match():
    check, _ = verifier(b"x" * 32, KEY)  # the second live key is the sender's
    sent = headers()
    other = Webhook("whsec_" + base64.b64encode(b"y" * 32).decode()).sign(
        "msg_1", datetime.fromtimestamp(NOW, UTC), BODY.decode()
    )
    sent["webhook-signature"] = f"v1a,Zm9v {other} garbage v1,%% {sent['webhook-signature']}"
    delivery = parse_headers(sent, NOW)
    assert len(delivery.signatures) == 2  # v1a, versionless and non-base64 are skipped
    await check.verify("rt", delivery, BODY)


async def test_the_signed_content_is_id_timestamp_and_raw_body():
    check, _ = verifier(KEY)
    content = b"msg_9." + str(NOW).encode() + b"." + BODY
    mac = base64.b64encode(hmac.new(KEY, content, hashlib.sha256).digest()).decode()
    sent = {"webhook-id": "msg_9", "webhook-timestamp": str(NOW), "webhook-signature": f"v1,{mac}"}
    await check.verify("rt", parse_headers(sent, NOW), BODY)
    for body in (BODY + b" ", BODY[:-1]):
        with pytest.raises(InvalidSignature):
            await check.verify("rt", parse_headers(sent, NOW), body)
    with pytest.raises(InvalidSignature):
        await check.verify("rt", parse_headers({**sent, "webhook-id": "msg_8"}, NOW), BODY)


async def test_no_covering_secret_is_the_same_refusal_as_a_wrong_signature():
    check, loads = verifier()
    with pytest.raises(InvalidSignature) as nobody:
        await check.verify("rt", parse_headers(headers(), NOW), BODY)
    wrong, _ = verifier(b"z" * 32)
    with pytest.raises(InvalidSignature) as mismatch:
        await wrong.verify("rt", parse_headers(headers(), NOW), BODY)
    assert nobody.value.detail == mismatch.value.detail
    assert loads == ["rt"]


async def test_no_usable_signature_needs_no_lookup():
    check, loads = verifier(KEY)
    sent = {**headers(), "webhook-signature": "v2,AAAA"}
    with pytest.raises(InvalidSignature):
        await check.verify("rt", parse_headers(sent, NOW), BODY)
    assert loads == []


@pytest.mark.parametrize("missing", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_each_header_is_required(missing):
    sent = headers()
    del sent[missing]
    with pytest.raises(InvalidSignature, match="needs the webhook-id"):
        parse_headers(sent, NOW)


def test_query_fields():
    assert query_fields(QueryParams("priority=7&ttl_seconds=1.5").multi_items()) == {
        "priority": 7,
        "ttl_seconds": 1.5,
    }
    assert query_fields(QueryParams("").multi_items()) == {}
    for query, field in [
        ("priority=x", "priority"),
        ("priority=1&priority=1", "priority"),
        ("color=red", "color"),
        ("delay_seconds=1e3", "delay_seconds"),
        ("max_attempts=", "max_attempts"),
    ]:
        with pytest.raises(ValidationFailed) as caught:
            query_fields(QueryParams(query).multi_items())
        assert caught.value.extra["field"] == field
