"""Sealed cursors (gateway/api/cursors.py): what a client holds says nothing of the position,
and only the exact text issued to a caller opens, for that caller."""

from __future__ import annotations

import base64
import uuid

import pytest

from gateway.api.credential_bodies import Scope
from gateway.api.cursors import CursorSeal
from gateway.auth.principals import ADMIN, Principal
from gateway.errors import ValidationFailed

SECRET = "s" * 40
ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def seal(secret: str = SECRET, purpose: str = "runtimes") -> CursorSeal:
    return CursorSeal(secret, purpose, 128)


def refused(s: CursorSeal, cursor: str, bound_to: bytes) -> None:
    with pytest.raises(ValidationFailed) as caught:
        s.open(cursor, bound_to)
    assert caught.value.extra["field"] == "cursor"


def test_a_cursor_opens_to_its_position_for_its_caller():
    s = seal()
    for position in (b"", b"a", b"team-a.build:7", b"x" * 128):
        assert s.open(s.seal(position, b"me"), b"me") == position


def test_another_replica_with_the_same_secret_opens_it():
    assert seal().open(seal().seal(b"rt-1", b"me"), b"me") == b"rt-1"


@pytest.mark.parametrize(
    ("other", "bound_to"),
    [
        (seal(secret="t" * 40), b"me"),  # the admin token changed: start again
        (seal(purpose="tokens"), b"me"),  # another listing's cursor
        (seal(), b"someone else"),
        (seal(), b""),
    ],
)
def test_it_opens_for_nobody_else(other, bound_to):
    refused(other, seal().seal(b"rt-1", b"me"), bound_to)


def test_every_cursor_has_one_length_and_differs_each_time():
    s = seal()
    cursors = [s.seal(p, b"me") for p in (b"", b"a", b"x" * 128, b"a")]
    assert len({len(c) for c in cursors}) == 1
    assert len(set(cursors)) == len(cursors)  # the same position twice: two cursors


def test_the_position_cannot_be_read_from_it():
    s = seal()
    position = b"tenant-b-secret-runtime"
    cursor = s.seal(position, b"me")
    raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    assert position not in raw and b"tenant" not in raw
    assert "tenant" not in cursor


def test_any_changed_character_is_refused():
    s = seal()
    cursor = s.seal(b"rt-1", b"me")
    for i, char in enumerate(cursor):
        changed = ALPHABET[(ALPHABET.index(char) + 1) % len(ALPHABET)]
        refused(s, cursor[:i] + changed + cursor[i + 1 :], b"me")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "***",
        "é",
        "A" * 10_000,
        base64.urlsafe_b64encode(b"rt-1").decode().rstrip("="),  # the former format
    ],
)
def test_made_up_text_is_refused(text):
    refused(seal(), text, b"me")


def test_cut_lengthened_or_not_canonical_text_is_refused():
    s = seal()
    cursor = s.seal(b"rt-1", b"me")
    for text in (
        cursor[:-1],
        cursor + "A",
        cursor + "=",
        " " + cursor,
        cursor[:10] + "." + cursor[10:],
    ):
        refused(s, text, b"me")


def test_a_principal_is_its_token_not_its_name():
    a = Principal("ci", frozenset({Scope.READ}), ("a-*",), uuid.uuid4())
    b = Principal("ci", frozenset({Scope.READ}), ("a-*",), uuid.uuid4())  # same name, later
    identities = {a.identity, b.identity, ADMIN.identity}
    assert len(identities) == 3
    s = seal()
    refused(s, s.seal(b"rt-1", a.identity), b.identity)
    refused(s, s.seal(b"rt-1", a.identity), ADMIN.identity)
