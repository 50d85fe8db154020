"""The round-trip counter behind `make bench`'s round-trips scenario: it counts the
messages that end a round trip (Sync, Query) in what a client sends, whatever the
chunks the bytes arrive in; and through its relay, a real driver's statements count
as many round trips as the driver waits for."""

from __future__ import annotations

import asyncpg
import pytest

from bench.round_trips import SSL_REQUEST, FrontendMessages, RoundTripRelay


def message(kind: bytes, body: bytes = b"") -> bytes:
    return kind + (4 + len(body)).to_bytes(4, "big") + body


def startup() -> bytes:
    body = (196608).to_bytes(4, "big") + b"user\x00postgres\x00\x00"  # protocol 3.0
    return (4 + len(body)).to_bytes(4, "big") + body


SSL = (8).to_bytes(4, "big") + SSL_REQUEST.to_bytes(4, "big")
# An extended-protocol statement (one round trip), a simple query (one), and messages
# that wait for nothing (Flush, Terminate). Bodies hold the bytes "S" and "Q".
STREAM = (
    SSL
    + startup()
    + message(b"P", b"\x00SELECT 'SQ'\x00\x00\x00")
    + message(b"B", b"\x00\x00" + b"S" * 70_000)
    + message(b"E", b"\x00\x00\x00\x00\x00")
    + message(b"S")
    + message(b"Q", b"BEGIN\x00")
    + message(b"H")
    + message(b"Q", b"COMMIT\x00")
    + message(b"X")
)


def test_sync_and_query_are_counted_and_nothing_else() -> None:
    counter = FrontendMessages()
    counter.feed(STREAM)
    assert counter.round_trips == 3


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 4096])
def test_the_count_does_not_depend_on_how_the_bytes_are_split(size: int) -> None:
    counter = FrontendMessages()
    for at in range(0, len(STREAM), size):
        counter.feed(STREAM[at : at + size])
    assert counter.round_trips == 3


@pytest.mark.integration
async def test_through_the_relay_each_statement_counts_what_the_driver_waits_for(
    database_url: str,
) -> None:
    async with RoundTripRelay(database_url) as relay:
        conn = await asyncpg.connect(relay.url(database_url))
        try:
            await conn.fetchval("SELECT $1::int", 1)  # prepared on first use
            before = relay.round_trips
            assert await conn.fetchval("SELECT $1::int", 2) == 2
            assert relay.round_trips - before == 1
            before = relay.round_trips
            async with conn.transaction():
                await conn.fetchval("SELECT $1::int", 3)
            assert relay.round_trips - before == 3  # BEGIN, the statement, COMMIT
            before = relay.round_trips
            await conn.execute("SELECT 1; SELECT 2")  # one simple query, two statements
            assert relay.round_trips - before == 1
        finally:
            await conn.close()
