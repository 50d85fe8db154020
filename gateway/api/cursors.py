"""Listing cursors. Keyset cursors (`keyset_cursor`) continue a listing whose every row
the caller may see: a runtime's tasks, the tokens. Sealed cursors: a listing position
that the client carries but can neither read, forge nor hand to another caller.

Why sealed. The runtimes listing (runtimes.py) walks every runtime in id order and
keeps the ones the token covers; when a token limited to patterns reaches the end of
its bounded walk, the place to go on from is the last runtime walked, which is most
often one the token does not cover. A cursor that spelt it out (base64, as before)
told a `read` token another tenant's runtime name; and a cursor the client could
write itself let it ask "which runtime follows X?" for any X. So the position is
encrypted (nothing of it can be read, not even its length) and authenticated, and the
authentication covers the caller it was issued to (`bound_to`): a cursor made up,
altered, or issued to another token is refused, so it can only continue a walk that
this same caller was already given.

Construction, from the standard library only (no compiled dependency for one small
feature): encrypt-then-MAC with HMAC-SHA256 as the PRF.
  - keys: `enc = HMAC(secret, LABEL | purpose | 0x01)` and `mac = HMAC(secret, LABEL |
    purpose | 0x02)`: one key per use and per listing, from one secret;
  - `nonce`: 16 random bytes per cursor, so two cursors for the same place differ;
  - plaintext: one length byte, the position, zeros up to `size + 1` bytes, so every
    cursor of a listing has the same length whatever the position;
  - ciphertext: plaintext XOR `HMAC(enc, nonce | counter)` blocks (counter mode);
  - tag: the first 16 bytes of `HMAC(mac, version | nonce | ciphertext | len(bound_to)
    | bound_to)`, checked in constant time before anything is decrypted;
  - text: base64url without padding of `version | nonce | ciphertext | tag`. Only the
    canonical text is accepted (a decoder that skips stray characters would take
    altered text for the original).

The secret must be one every replica behind a load balancer already holds, so that a
cursor from one is accepted by the next without a new setting: the gateway uses
GATEWAY_ADMIN_TOKEN (instance.py), which is long and random (at least 32 characters).
Changing that token changes the keys: cursors issued before are refused (422) and the
client lists again from the first page; during a rolling change, replicas with the old
and the new token refuse each other's cursors until the rollout ends. With
GATEWAY_AUTH=off there may be no admin token; the key is then derived from an empty
secret and can be forged, which changes nothing, since every caller is then an admin
who sees every runtime.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import uuid
from datetime import UTC, datetime

from ..errors import ValidationFailed
from ..rows import TaskRow
from .values import EARLIEST, LATEST

LABEL = b"claim-gateway sealed cursor"
VERSION = 1
NONCE_BYTES = 16
TAG_BYTES = 16  # 128 bits: a forgery must guess it, one request per guess
_BLOCK_BYTES = hashlib.sha256().digest_size
REFUSED = "cursor is not one this server returned as next_cursor"


class CursorSeal:
    """Seals and opens one listing's cursors. `purpose` names the listing, so that a
    cursor of one listing is refused by another; `size` is the longest position in
    bytes (at most 255), and every cursor is as long as that one's."""

    def __init__(self, secret: str, purpose: str, size: int) -> None:
        if not 1 <= size <= 255:
            raise ValueError("size must be from 1 to 255 bytes")
        root = secret.encode()
        info = LABEL + b"|" + purpose.encode() + b"|"
        self._enc = hmac.new(root, info + b"\x01", hashlib.sha256).digest()
        self._mac = hmac.new(root, info + b"\x02", hashlib.sha256).digest()
        self._size = size
        self._bytes = 1 + NONCE_BYTES + size + 1 + TAG_BYTES

    def seal(self, position: bytes, bound_to: bytes) -> str:
        """The cursor for `position`, which only `open` with the same `bound_to` (the
        caller it is issued to) gives back."""
        if len(position) > self._size:
            raise ValueError(f"a position holds at most {self._size} bytes")
        padded = bytes([len(position)]) + position + bytes(self._size - len(position))
        nonce = secrets.token_bytes(NONCE_BYTES)
        body = bytes([VERSION]) + nonce + self._xor(nonce, padded)
        raw = body + self._tag(body, bound_to)
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    def open(self, cursor: str, bound_to: bytes) -> bytes:
        """The position a cursor sealed for `bound_to` holds, or ValidationFailed (422
        naming `cursor`) for any cursor this seal did not issue to that caller."""
        raw = self._decode(cursor)
        if raw is None or len(raw) != self._bytes or raw[0] != VERSION:
            raise ValidationFailed(REFUSED, field="cursor")
        body, tag = raw[:-TAG_BYTES], raw[-TAG_BYTES:]
        if not hmac.compare_digest(tag, self._tag(body, bound_to)):
            raise ValidationFailed(REFUSED, field="cursor")
        nonce = body[1 : 1 + NONCE_BYTES]
        padded = self._xor(nonce, body[1 + NONCE_BYTES :])
        length = padded[0]
        if length > self._size or any(padded[1 + length :]):
            # Only a bug (or a broken key) can get here: the tag was good.
            raise ValidationFailed(REFUSED, field="cursor")
        return padded[1 : 1 + length]

    def _tag(self, body: bytes, bound_to: bytes) -> bytes:
        message = body + len(bound_to).to_bytes(4, "big") + bound_to
        return hmac.new(self._mac, message, hashlib.sha256).digest()[:TAG_BYTES]

    def _xor(self, nonce: bytes, data: bytes) -> bytes:
        blocks = (len(data) + _BLOCK_BYTES - 1) // _BLOCK_BYTES
        stream = b"".join(
            hmac.new(self._enc, nonce + i.to_bytes(4, "big"), hashlib.sha256).digest()
            for i in range(blocks)
        )
        return bytes(a ^ b for a, b in zip(data, stream, strict=False))

    def _decode(self, cursor: str) -> bytes | None:
        # Longer than any cursor this seal makes: refused before decoding it.
        if len(cursor) > 2 * self._bytes:
            return None
        try:
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        except (ValueError, binascii.Error):
            return None
        if base64.urlsafe_b64encode(raw).decode().rstrip("=") != cursor:
            return None  # not the canonical text: characters skipped, or bits changed
        return raw


def encode_cursor(row: TaskRow) -> str:
    return keyset_cursor(row.created_at, row.id)


def keyset_cursor(created_at: datetime, row_id: uuid.UUID) -> str:
    """The cursor after a row of a listing ordered by (created_at, id), for a caller who
    may see every row of it (a runtime's tasks, the tokens): opaque to clients, but not
    sealed, since it names a row the caller was just shown."""
    raw = f"{created_at.astimezone(UTC).isoformat()}|{row_id}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    """The (created_at, id) a keyset_cursor continues after, or 422 naming `cursor`."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        created, task_id = raw.split("|")
        when = datetime.fromisoformat(created)
        if when.tzinfo is None or not EARLIEST <= when <= LATEST:
            raise ValueError(created)
        return when, uuid.UUID(task_id)
    except (ValueError, UnicodeDecodeError):
        raise ValidationFailed(
            "cursor is not one this server returned as next_cursor", field="cursor"
        ) from None
