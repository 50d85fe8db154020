"""The round-trips bench's reading of the Postgres wire protocol: which messages it
counts as a request's round trips, and which it counts apart (the schedule pass, and a
statement's preparation on a connection)."""

from __future__ import annotations

import struct

import pytest

from bench.round_trips import FrontendMessages
from gateway.store.sql import schedules as schedule_sql

STARTUP = struct.pack("!II", 8, 196608)  # length, protocol 3.0
SYNC = b"S" + struct.pack("!I", 4)
EXECUTE = b"E" + struct.pack("!I", 9) + b"\0" + struct.pack("!I", 0)


def message(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!I", len(body) + 4) + body


def parse(name: str, text: str) -> bytes:
    return message(b"P", name.encode() + b"\0" + text.encode() + b"\0" + b"\0\0")


def bind(name: str) -> bytes:
    return message(b"B", b"\0" + name.encode() + b"\0" + b"\0\0" + b"\0\0" + b"\0\0")


def query(text: str) -> bytes:
    return message(b"Q", text.encode() + b"\0")


def run(name: str) -> bytes:
    return bind(name) + EXECUTE + SYNC


def prepare(name: str, text: str) -> bytes:
    return parse(name, text) + message(b"D", b"S" + name.encode() + b"\0") + SYNC


CLAIM = "WITH candidates AS (SELECT 1)"
STREAM = b"".join(
    [
        STARTUP,
        prepare("s1", CLAIM),  # set-up: the statement's first run on this connection
        prepare("s2", "WITH RECURSIVE typeinfo_tree(oid) AS (SELECT 1) SELECT 1"),
        run("s2"),  # set-up: the driver's type introspection
        run("s1"),
        run("s1"),
        prepare("s3", schedule_sql.NEXT_DUE_IN),  # set-up
        run("s3"),  # background
        prepare("s4", schedule_sql.DUE_SCHEDULES),  # set-up
        query("BEGIN; SET LOCAL statement_timeout = 10000"),
        run("s4"),
        query("COMMIT"),  # the whole transaction: background
        query("BEGIN; SET LOCAL statement_timeout = 10000"),
        parse("s5", schedule_sql.DUE_SCHEDULES) + bind("s5") + EXECUTE + SYNC,
        query("COMMIT"),  # parsed and run in one exchange: background
        query("BEGIN; SET LOCAL statement_timeout = 10000"),
        run("s1"),
        query("COMMIT"),  # a request's transaction: 3
        parse("", CLAIM) + bind("") + EXECUTE + SYNC,  # unnamed: parsed every run, 1
    ]
)


def counts(messages: FrontendMessages) -> tuple[int, int, int]:
    return (
        messages.round_trips,
        messages.background_round_trips,
        messages.set_up_round_trips,
    )


def test_requests_background_and_set_up_are_counted_apart() -> None:
    messages = FrontendMessages()
    messages.feed(STREAM)
    assert counts(messages) == (6, 7, 5)


@pytest.mark.parametrize("size", [1, 3, 7, 64])
def test_the_counts_do_not_depend_on_how_the_stream_is_cut(size: int) -> None:
    messages = FrontendMessages()
    for start in range(0, len(STREAM), size):
        messages.feed(STREAM[start : start + size])
    assert counts(messages) == (6, 7, 5)
