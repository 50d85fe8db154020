"""The server's idle connections (gateway/http/deadlines.py), on a real event loop:
each closed after its timeout counted from when it last went idle, never a busy one,
one timer for many requests and many connections, and nothing held for a connection
that is busy or gone."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.http.deadlines import KeepAlive

SECONDS = 0.2


class Conn:
    def __init__(self, closed: list[tuple[Conn, float]], seconds: float = SECONDS) -> None:
        self.loop = asyncio.get_running_loop()
        self.timeout_keep_alive = seconds
        self._closed = closed

    def timeout_keep_alive_handler(self) -> None:
        self._closed.append((self, self.loop.time()))


async def test_an_idle_connection_is_closed_after_its_timeout_from_its_last_idle() -> None:
    closed: list[tuple[Conn, float]] = []
    clock = KeepAlive()
    a, b = Conn(closed), Conn(closed)
    loop = asyncio.get_running_loop()
    clock.idle(a)
    clock.idle(b)
    await asyncio.sleep(SECONDS / 2)
    clock.busy(a)  # a request arrives on a: the timer stays armed for b
    await asyncio.sleep(SECONDS / 4)
    a_idle_again = loop.time()
    clock.idle(a)
    await asyncio.sleep(SECONDS * 2)
    assert [c for c, _ in closed] == [b, a]
    # a is closed not when b is (its first idle's time), but after its last idle's.
    assert closed[1][1] - a_idle_again >= SECONDS - 0.01
    assert len(clock) == 0


async def test_a_busy_connection_is_never_closed_nor_held() -> None:
    closed: list[tuple[Conn, float]] = []
    clock = KeepAlive()
    a = Conn(closed)
    clock.idle(a)
    clock.busy(a)
    assert len(clock) == 0  # a parked poll holds nothing here
    await asyncio.sleep(SECONDS * 2)  # a long poll, say
    assert closed == []
    clock.idle(a)
    await asyncio.sleep(SECONDS * 2)
    assert [c for c, _ in closed] == [a]


async def test_many_requests_and_connections_make_one_timer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    made = 0
    call_at = loop.call_at

    def counting(when: float, callback: Any, *args: Any, **kw: Any) -> asyncio.TimerHandle:
        nonlocal made
        made += 1
        return call_at(when, callback, *args, **kw)

    monkeypatch.setattr(loop, "call_at", counting)
    clock = KeepAlive()
    conns = [Conn([]) for _ in range(50)]
    for _ in range(20):
        for conn in conns:
            clock.busy(conn)
            clock.idle(conn)
    assert made == 1
    for conn in conns:
        clock.busy(conn)  # lost
    assert len(clock) == 0


async def test_a_new_event_loop_starts_afresh() -> None:
    closed: list[tuple[Conn, float]] = []
    clock = KeepAlive()

    async def in_its_own_loop() -> None:
        clock.idle(Conn([]))  # its timer belongs to a loop about to end

    await asyncio.to_thread(asyncio.run, in_its_own_loop())
    a = Conn(closed)
    clock.idle(a)
    await asyncio.sleep(SECONDS * 2)
    assert [c for c, _ in closed] == [a]
