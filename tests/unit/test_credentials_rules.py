"""What a token or webhook secret request may say, and the secrets' formats."""

from __future__ import annotations

import base64
import re
import uuid

import pytest

from gateway.api.credential_bodies import Scope
from gateway.auth.credentials import (
    new_token_secret,
    parse_ref,
    parse_token_spec,
    parse_webhook_secret_spec,
    webhook_secret_text,
)
from gateway.errors import ValidationFailed


def test_a_token_spec() -> None:
    spec = parse_token_spec({"name": "ci-runner", "scopes": ["claim", "read", "claim"]})
    assert (spec.name, spec.scopes, spec.runtimes) == (
        "ci-runner",
        (Scope.CLAIM, Scope.READ),
        None,
    )
    spec = parse_token_spec({"name": "a", "scopes": ["enqueue"], "runtimes": ["ci-*", "b", "b"]})
    assert spec.runtimes == ("ci-*", "b")
    assert parse_token_spec({"name": "a", "scopes": ["admin"], "runtimes": None}).runtimes is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"scopes": ["read"]}, "name"),
        ({"name": "", "scopes": ["read"]}, "name"),
        ({"name": "has space", "scopes": ["read"]}, "name"),
        ({"name": "x" * 101, "scopes": ["read"]}, "name"),
        ({"name": str(uuid.uuid4()), "scopes": ["read"]}, "name"),
        ({"name": "a"}, "scopes"),
        ({"name": "a", "scopes": []}, "scopes"),
        ({"name": "a", "scopes": "read"}, "scopes"),
        ({"name": "a", "scopes": ["read", "write"]}, "scopes"),
        ({"name": "a", "scopes": [["read"]]}, "scopes"),
        ({"name": "a", "scopes": ["read"], "runtimes": []}, "runtimes"),
        ({"name": "a", "scopes": ["read"], "runtimes": "ci-*"}, "runtimes"),
        ({"name": "a", "scopes": ["read"], "runtimes": ["bad/one"]}, "runtimes"),
        ({"name": "a", "scopes": ["read"], "runtimes": ["-x"]}, "runtimes"),
        ({"name": "a", "scopes": ["read"], "runtimes": [3]}, "runtimes"),
        ({"name": "a", "scopes": ["read"], "runtimes": ["x"] * 101}, "runtimes"),
        ({"name": "a", "scopes": ["admin"], "runtimes": ["x"]}, "runtimes"),
        ({"name": "a", "scopes": ["read"], "runtime": ["x"]}, "runtime"),
    ],
)
def test_bad_token_specs_name_the_field(body: dict, field: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        parse_token_spec(body)
    assert caught.value.extra["field"] == field


def test_a_webhook_secret_spec_needs_runtimes() -> None:
    spec = parse_webhook_secret_spec({"name": "github", "runtimes": ["ci-*"]})
    assert (spec.name, spec.runtimes) == ("github", ("ci-*",))
    for body, field in (
        ({"name": "github"}, "runtimes"),
        ({"name": "github", "runtimes": []}, "runtimes"),
        ({"runtimes": ["x"]}, "name"),
        ({"name": "g", "runtimes": ["x"], "scopes": ["read"]}, "scopes"),
    ):
        with pytest.raises(ValidationFailed) as caught:
            parse_webhook_secret_spec(body)
        assert caught.value.extra["field"] == field


def test_secret_formats() -> None:
    token = new_token_secret()
    assert re.fullmatch(r"gwt_[A-Za-z0-9_-]{43}", token)
    assert new_token_secret() != token
    key = bytes(range(32))
    text = webhook_secret_text(key)
    assert text.startswith("whsec_")
    assert base64.b64decode(text.removeprefix("whsec_")) == key


def test_refs_are_ids_or_names() -> None:
    some_id = uuid.uuid4()
    assert parse_ref(str(some_id)) == some_id
    assert parse_ref("ci-runner") == "ci-runner"
