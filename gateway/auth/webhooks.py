"""Signed enqueue: a Standard Webhooks delivery (standardwebhooks.com) becomes a task.

`POST /v1/runtimes/{rt}/webhooks` carries no bearer token; its signature is the
credential. The sender signs `"<webhook-id>.<webhook-timestamp>.<body>"` with HMAC-SHA256
under the key of a `whsec_` secret and sends `webhook-signature: v1,<base64>` (several,
space-separated, while it rotates secrets). Any live secret whose runtime patterns cover
the path's runtime may match. The `webhook-id` is the task's idempotency key (as
`webhook:<id>`), so a redelivery is a replay. Only the id, timestamp and body are
signed: the path's runtime (within the secret's patterns) and the query parameters are
the sender's configuration, not part of the signature.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from ..api import bodies
from ..api.bodies import WEBHOOK_KEY_PREFIX
from ..errors import InvalidSignature
from .principals import LocalCache

# How far webhook-timestamp may be from this clock, either way, in seconds (the spec's 5 min).
TOLERANCE_SECONDS = 300
# How long one process trusts the list of secrets covering a runtime, in seconds; a
# revoked secret stops verifying on every instance within this.
SECRET_CACHE_TTL_SECONDS = 2.0
SECRET_CACHE_ENTRIES = 10_000
TIMESTAMP_RE = re.compile(r"^[0-9]{1,15}$")

REFUSED = "no webhook-signature matches a live webhook secret covering this runtime"
# Deliveries' ids live beside producers' Idempotency-Keys on a runtime; producers may
# not make a key with this prefix (models refuses it), so a sender's id never meets one.
KEY_PREFIX = WEBHOOK_KEY_PREFIX
MAX_MSG_ID = bodies.MAX_IDEMPOTENCY_KEY - len(KEY_PREFIX)


@dataclass(frozen=True)
class Delivery:
    """The signature headers of one delivery, checked for presence and freshness."""

    msg_id: str
    timestamp: str  # as sent: it is part of the signed content
    signatures: tuple[bytes, ...]  # the decoded v1 signatures; others are ignored

    def signed_content(self, body: bytes) -> bytes:
        # Starlette decodes header bytes as latin-1; encoding back gives what was signed.
        return b".".join((self.msg_id.encode("latin-1"), self.timestamp.encode("latin-1"), body))


def parse_headers(headers: Mapping[str, str], now: float) -> Delivery:
    """The delivery's signature headers, or InvalidSignature (401) when one is missing,
    the timestamp is malformed or more than TOLERANCE_SECONDS from `now` (epoch s)."""
    msg_id = headers.get("webhook-id", "")
    timestamp = headers.get("webhook-timestamp", "")
    signature = headers.get("webhook-signature", "")
    if not (msg_id and timestamp and signature):
        raise InvalidSignature(
            "a signed delivery needs the webhook-id, webhook-timestamp and webhook-signature "
            "headers (Standard Webhooks)"
        )
    if not TIMESTAMP_RE.fullmatch(timestamp):
        raise InvalidSignature("webhook-timestamp must be whole seconds since the Unix epoch")
    if abs(int(timestamp) - now) > TOLERANCE_SECONDS:
        raise InvalidSignature(
            f"webhook-timestamp is more than {TOLERANCE_SECONDS} s away from the gateway's "
            "clock; sign each delivery (and each retry) with the current time"
        )
    signatures = []
    for item in signature.split():
        version, _, encoded = item.partition(",")
        if version != "v1":
            continue  # another scheme (v1a is asymmetric): not ours to judge
        try:
            signatures.append(base64.b64decode(encoded, validate=True))
        except binascii.Error:
            continue
    return Delivery(msg_id, timestamp, tuple(signatures))


class Verifier:
    """Checks deliveries against the signing keys of the live secrets covering a
    runtime, read through `keys_for` and cached per runtime for at most
    SECRET_CACHE_TTL_SECONDS, so that webhook traffic rarely reads Postgres. Owned by
    the Gateway."""

    def __init__(
        self,
        keys_for: Callable[[str], Awaitable[tuple[bytes, ...]]],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._keys_for = keys_for
        self.clock = clock
        self.cache: LocalCache[str, tuple[bytes, ...]] = LocalCache(
            SECRET_CACHE_TTL_SECONDS, SECRET_CACHE_ENTRIES
        )

    async def verify(self, runtime_id: str, delivery: Delivery, body: bytes) -> None:
        """Returns when one signature matches one covering key; else InvalidSignature.
        No secret covering the runtime gets the same answer as a wrong signature."""
        if not delivery.signatures:
            raise InvalidSignature(REFUSED)
        keys = await self.cache.get(runtime_id, self._keys_for)
        content = delivery.signed_content(body)
        for key in keys:
            expected = hmac.new(key, content, hashlib.sha256).digest()
            for signature in delivery.signatures:
                if hmac.compare_digest(expected, signature):
                    return
        raise InvalidSignature(REFUSED)
