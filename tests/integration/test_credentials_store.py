"""Token and webhook-secret storage against a real Postgres (gateway.auth.credentials)."""

from __future__ import annotations

import base64
import secrets
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from gateway.api.credential_bodies import Scope
from gateway.auth.credentials import Credentials, TokenSpec, WebhookSecretSpec, parse_token_spec
from gateway.auth.principals import Principal, glob_match, hash_token
from gateway.errors import AlreadyExists, NotFound
from gateway.metrics import Metrics
from gateway.store import Store

pytestmark = pytest.mark.integration


@pytest.fixture
async def creds(database_url: str) -> AsyncIterator[Credentials]:
    store = Store(database_url, Metrics(), min_size=1, max_size=2)
    await store.open()
    yield Credentials(store)
    await store.close()


def unique(prefix: str = "t") -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


async def test_a_token_is_stored_as_the_hash_of_its_secret(creds, conn):
    name = unique()
    row, secret = await creds.create_token(parse_token_spec({"name": name, "scopes": ["read"]}))
    stored = await conn.fetchrow("SELECT * FROM api_tokens WHERE id = $1", row["id"])
    assert bytes(stored["secret_hash"]) == hash_token(secret)
    assert all(secret not in str(value) for value in stored.values())
    assert await creds.principal_by_hash(hash_token(secret)) == Principal(
        name, frozenset({Scope.READ}), None, row["id"]
    )
    assert await creds.principal_by_hash(hash_token(secret + "x")) is None


async def test_runtimes_and_scopes_round_trip(creds):
    spec = TokenSpec(unique(), (Scope.ENQUEUE, Scope.CLAIM), ("ci-*", "build.1"))
    _, secret = await creds.create_token(spec)
    principal = await creds.principal_by_hash(hash_token(secret))
    assert principal is not None
    assert principal.scopes == {Scope.ENQUEUE, Scope.CLAIM}
    assert principal.runtimes == ("ci-*", "build.1")


async def test_a_live_name_is_unique_and_free_again_once_revoked(creds, conn):
    name = unique()
    spec = TokenSpec(name, (Scope.READ,), None)
    first, _ = await creds.create_token(spec)
    count = await conn.fetchval("SELECT count(*) FROM api_tokens")
    with pytest.raises(AlreadyExists) as caught:
        await creds.create_token(spec)
    assert caught.value.extra["field"] == "name"
    assert await conn.fetchval("SELECT count(*) FROM api_tokens") == count
    await creds.revoke_token(name)
    second, _ = await creds.create_token(spec)
    assert second["id"] != first["id"]


async def test_revoke_by_id_by_name_and_unknown(creds):
    row, secret = await creds.create_token(TokenSpec(unique(), (Scope.READ,), None))
    revoked = await creds.revoke_token(row["id"])
    assert revoked["revoked_at"] is not None
    assert await creds.principal_by_hash(hash_token(secret)) is None
    again = await creds.revoke_token(row["id"])  # idempotent, keeps the first time
    assert again["revoked_at"] == revoked["revoked_at"]
    with pytest.raises(NotFound):
        await creds.revoke_token(row["name"])  # a name means a live token
    with pytest.raises(NotFound):
        await creds.revoke_token(uuid.uuid4())
    by_name, _ = await creds.create_token(TokenSpec(unique(), (Scope.READ,), None))
    assert (await creds.revoke_token(by_name["name"]))["id"] == by_name["id"]


async def test_list_hides_revoked_tokens_unless_asked(creds):
    live, _ = await creds.create_token(TokenSpec(unique(), (Scope.READ,), None))
    gone, _ = await creds.create_token(TokenSpec(unique(), (Scope.READ,), None))
    await creds.revoke_token(gone["id"])
    # From just before `live`: the session's database holds other tests' tokens too.
    start = (live["created_at"], uuid.UUID(int=0))
    ids = [r["id"] for r in await creds.list_tokens(after=start)]
    assert live["id"] in ids and gone["id"] not in ids
    every = [r["id"] for r in await creds.list_tokens(include_revoked=True, after=start)]
    assert live["id"] in every and gone["id"] in every
    assert every.index(live["id"]) < every.index(gone["id"])  # oldest first


async def test_list_pages_after_the_last_token_of_the_previous_page(creds):
    made = [
        (await creds.create_token(TokenSpec(unique(), (Scope.READ,), None)))[0] for _ in range(5)
    ]
    after = (made[0]["created_at"], uuid.UUID(int=0))
    seen = []
    while len(seen) < len(made):
        page = await creds.list_tokens(limit=2, after=after)
        assert 1 <= len(page) <= 2
        seen += [r["id"] for r in page]
        after = (page[-1]["created_at"], page[-1]["id"])
    assert seen[: len(made)] == [r["id"] for r in made]


async def test_webhook_secrets_by_runtime(creds, conn):
    # Other tests' secrets share this database: check for these keys, not for equality.
    tag = secrets.token_hex(3)
    row, text = await creds.create_webhook_secret(
        WebhookSecretSpec(unique("wh"), (f"hook-{tag}-*", f"exact-{tag}"))
    )
    stored = await conn.fetchrow("SELECT * FROM webhook_secrets WHERE id = $1", row["id"])
    key = bytes(stored["signing_key"])
    assert text == "whsec_" + base64.b64encode(key).decode() and len(key) == 32
    assert key in await creds.webhook_keys(f"hook-{tag}-1")
    assert key in await creds.webhook_keys(f"exact-{tag}")
    assert key not in await creds.webhook_keys(f"exact-{tag}x")
    _, other_text = await creds.create_webhook_secret(
        WebhookSecretSpec(unique("wh"), (f"hook-{tag}-*",))
    )
    other = base64.b64decode(other_text.removeprefix("whsec_"))
    keys = await creds.webhook_keys(f"hook-{tag}-2")
    assert keys.index(other) < keys.index(key)  # newest first
    await creds.revoke_webhook_secret(row["id"])
    keys = await creds.webhook_keys(f"hook-{tag}-1")
    assert other in keys and key not in keys
    assert key not in await creds.webhook_keys(f"exact-{tag}")
    assert row["id"] not in [r["id"] for r in await creds.list_webhook_secrets()]
    every = await creds.list_webhook_secrets(include_revoked=True)
    assert row["id"] in [r["id"] for r in every]
    assert all("signing_key" not in r for r in every)


PATTERNS = ["ci-*", "*", "a_b", "a*b*c", "x.y", "*-prod", "exact", "a:*:z", "__*"]
RUNTIMES = ["ci-1", "ci-", "xci-1", "a_b", "aXb", "abc", "aXbYc", "ac", "x.y", "xzy",
            "eu-prod", "prod", "exact", "exactly", "a:1:z", "a::z", "__init", "_x"]  # fmt: skip


@pytest.mark.parametrize("pattern", PATTERNS)
async def test_sql_globs_match_exactly_what_principals_match(creds, pattern):
    """The webhook lookup matches globs in SQL, tokens in Python: they must agree."""
    row, text = await creds.create_webhook_secret(WebhookSecretSpec(unique("glob"), (pattern,)))
    key = base64.b64decode(text.removeprefix("whsec_"))
    try:
        for runtime in RUNTIMES:
            expected = glob_match(pattern, runtime)
            assert (key in await creds.webhook_keys(runtime)) is expected, (pattern, runtime)
    finally:
        await creds.revoke_webhook_secret(row["id"])


async def test_the_schema_refuses_what_the_parsers_refuse(conn):
    with pytest.raises(asyncpg.CheckViolationError):
        await conn.execute(
            "INSERT INTO api_tokens (name, secret_hash, scopes) VALUES ($1, $2, $3)",
            unique(),
            hash_token("x"),
            ["write"],
        )
    with pytest.raises(asyncpg.CheckViolationError):
        await conn.execute(
            "INSERT INTO webhook_secrets (name, signing_key, runtimes) VALUES ($1, $2, $3)",
            unique(),
            b"k" * 32,
            [],
        )
