"""The authenticator and its per-process cache of token lookups, without a database."""

from __future__ import annotations

import asyncio

import pytest

from gateway.api.credential_bodies import Scope
from gateway.auth.principals import (
    ADMIN,
    TOKEN_CACHE_TTL_SECONDS,
    TOKEN_PREFIX,
    Authenticator,
    LocalCache,
    Principal,
    glob_match,
    hash_token,
)
from gateway.errors import StoreUnavailable, Unauthorized
from gateway.settings import Settings
from tests.support.clocks import FakeClock

ADMIN_TOKEN = "a" * 40


class Loader:
    """Counts loads; answers from a dict, or raises when told to."""

    def __init__(self, values: dict[str, str | None]) -> None:
        self.values = values
        self.calls: list[str] = []
        self.fail = False

    async def __call__(self, key: str) -> str | None:
        self.calls.append(key)
        await asyncio.sleep(0)
        if self.fail:
            raise StoreUnavailable("down")
        return self.values.get(key)


def test_the_token_cache_ttl_is_at_most_two_seconds() -> None:
    assert 0 < TOKEN_CACHE_TTL_SECONDS <= 2.0


async def test_hits_misses_and_expiry() -> None:
    clock = FakeClock()
    cache: LocalCache[str, str | None] = LocalCache(2.0, 10, clock)
    load = Loader({"a": "A"})
    assert await cache.get("a", load) == "A"
    assert await cache.get("b", load) is None  # a miss is cached too
    clock.now += 1.9
    assert await cache.get("a", load) == "A"
    assert await cache.get("b", load) is None
    assert load.calls == ["a", "b"]
    clock.now += 0.2  # 2.1 s after the loads
    load.values = {"b": "B"}
    assert await cache.get("a", load) is None
    assert await cache.get("b", load) == "B"
    assert load.calls == ["a", "b", "a", "b"]


async def test_size_is_bounded_least_recently_used_first() -> None:
    clock = FakeClock()
    cache: LocalCache[str, str | None] = LocalCache(2.0, 3, clock)
    load = Loader({})
    for key in "abc":
        await cache.get(key, load)
    await cache.get("a", load)  # a is now the most recently used
    await cache.get("d", load)
    assert len(cache) == 3
    load.calls.clear()
    await cache.get("a", load)
    await cache.get("b", load)  # dropped: reloaded
    assert load.calls == ["b"]


async def test_concurrent_lookups_share_one_load_and_failures_are_not_cached() -> None:
    cache: LocalCache[str, str | None] = LocalCache(2.0, 10, FakeClock())
    load = Loader({"a": "A"})
    load.fail = True
    results = await asyncio.gather(
        *(cache.get("a", load) for _ in range(5)), return_exceptions=True
    )
    assert all(isinstance(r, StoreUnavailable) for r in results)
    assert load.calls == ["a"]
    load.fail = False
    assert await cache.get("a", load) == "A"
    assert load.calls == ["a", "a"]


async def test_a_cancelled_waiter_does_not_cancel_the_shared_load() -> None:
    cache: LocalCache[str, str] = LocalCache(2.0, 10, FakeClock())
    gate = asyncio.Event()

    async def slow(key: str) -> str:
        await gate.wait()
        return key.upper()

    first = asyncio.create_task(cache.get("a", slow))
    second = asyncio.create_task(cache.get("a", slow))
    await asyncio.sleep(0)
    first.cancel()
    gate.set()
    assert await second == "A"
    with pytest.raises(asyncio.CancelledError):
        await first


async def test_expiry_counts_from_before_a_slow_load() -> None:
    clock = FakeClock()
    cache: LocalCache[str, str] = LocalCache(2.0, 10, clock)
    calls = 0

    async def slow(key: str) -> str:
        nonlocal calls
        calls += 1
        clock.now += 1.5  # the read took 1.5 s
        return key

    await cache.get("a", slow)
    clock.now += 0.6  # 2.1 s after the read began
    await cache.get("a", slow)
    assert calls == 2


def settings(**kw: object) -> Settings:
    return Settings(database_url="postgresql://x/y", redis_url="redis://x", **kw)  # type: ignore[arg-type]


READER = Principal("reader", frozenset({Scope.READ}), ("ci-*",))


async def test_authenticator_admin_issued_and_refused_tokens() -> None:
    secret = TOKEN_PREFIX + "s" * 43
    seen: list[bytes] = []

    async def lookup(secret_hash: bytes) -> Principal | None:
        seen.append(secret_hash)
        return READER if secret_hash == hash_token(secret) else None

    auth = Authenticator(settings(admin_token=ADMIN_TOKEN), lookup)
    assert await auth.authenticate(f"Bearer {ADMIN_TOKEN}") is ADMIN
    assert seen == []  # the admin token needs no lookup
    assert await auth.authenticate(f"Bearer {secret}") == READER
    assert await auth.authenticate(f"bearer {secret}") == READER  # cached
    assert seen == [hash_token(secret)]
    for header in (None, "", "Basic abc", f"Bearer {TOKEN_PREFIX}other", "Bearer no-prefix"):
        with pytest.raises(Unauthorized):
            await auth.authenticate(header)
    # A bearer without the prefix is refused without asking the database.
    assert seen == [hash_token(secret), hash_token(TOKEN_PREFIX + "other")]


async def test_a_caller_known_without_a_lookup_is_answered_at_once() -> None:
    """known() answers what authenticate() would when no lookup is needed, and None
    when authenticate() must look the token up (or refuse it)."""
    secret = TOKEN_PREFIX + "s" * 43

    async def lookup(secret_hash: bytes) -> Principal | None:
        return READER if secret_hash == hash_token(secret) else None

    auth = Authenticator(settings(admin_token=ADMIN_TOKEN), lookup)
    assert auth.known(f"Bearer {ADMIN_TOKEN}") is ADMIN
    assert auth.known(f"Bearer {secret}") is None  # not looked up yet
    assert await auth.authenticate(f"Bearer {secret}") == READER
    assert auth.known(f"bearer {secret}") == READER  # now in this process's cache
    assert auth.known("Bearer no-prefix") is None  # authenticate() refuses it
    for header in (None, "", "Basic abc"):
        with pytest.raises(Unauthorized):
            auth.known(header)
    assert Authenticator(settings(auth_enabled=False)).known(None) is ADMIN


def test_peek_answers_a_live_entry_without_loading() -> None:
    clock = FakeClock()
    cache: LocalCache[str, str | None] = LocalCache(1.0, 10, clock=clock)
    assert cache.peek("k") == (False, None)
    cache._entries["k"] = (clock() + 1.0, None)  # a cached miss is an answer too
    assert cache.peek("k") == (True, None)
    clock.advance(1.0)
    assert cache.peek("k") == (False, None)


async def test_authenticator_without_lookup_knows_only_the_admin_token() -> None:
    auth = Authenticator(settings(admin_token=ADMIN_TOKEN))
    with pytest.raises(Unauthorized):
        await auth.authenticate(f"Bearer {TOKEN_PREFIX}whatever")


async def test_auth_off_makes_everyone_admin() -> None:
    auth = Authenticator(settings(auth_enabled=False))
    assert await auth.authenticate(None) is ADMIN


def test_principal_scopes_and_globs() -> None:
    assert READER.allows(Scope.READ) and not READER.allows(Scope.CLAIM)
    assert READER.covers("ci-1") and READER.covers("ci-") and not READER.covers("xci-1")
    assert ADMIN.allows(Scope.CLAIM) and ADMIN.covers("anything")
    exact = Principal("x", frozenset({Scope.CLAIM}), ("a.b", "c_*_d"))
    assert exact.covers("a.b") and not exact.covers("aXb")  # . is not a wildcard
    assert exact.covers("c_1_d") and exact.covers("c__d") and not exact.covers("c_1")


@pytest.mark.parametrize(
    "pattern",
    ["*", "ci-*", "*-prod", "a*b*c", "a**b", "*a*", "exact", "a:*:z", "*-*-*", "x*x*x*x"],
)
def test_glob_match_agrees_with_fnmatch(pattern: str) -> None:
    """fnmatch is the reference for globs (it backtracks; glob_match must not)."""
    import fnmatch
    import random

    rng = random.Random(pattern)
    alphabet = "abcxz-:."
    candidates = ["", "a", "ab", "abc", "ci-1", "eu-prod", "a:1:z", "exact", "xxxx", "a-b-c"]
    candidates += ["".join(rng.choices(alphabet, k=rng.randint(0, 12))) for _ in range(300)]
    for runtime in candidates:
        assert glob_match(pattern, runtime) == fnmatch.fnmatchcase(runtime, pattern), runtime


def test_glob_match_does_not_backtrack_on_hostile_patterns() -> None:
    """A pattern like *-*-*-*-*-*-*-x against 127 dashes took a regex minutes; it must
    answer at once (pytest-timeout fails this test otherwise)."""
    pattern = "*-" * 20 + "x"
    assert not glob_match(pattern, "a" + "-" * 127)
    principal = Principal("t", frozenset({Scope.READ}), (pattern,))
    for _ in range(1000):
        assert not principal.covers("a" + "-" * 127)
