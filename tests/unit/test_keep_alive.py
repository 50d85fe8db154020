"""One connection's keep-alive clock (gateway/http/keep_alive.py), on a real event loop:
it closes an idle connection after its seconds counted from when it last went idle,
never a busy one, and makes one timer for many requests."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.http.keep_alive import KeepAlive

SECONDS = 0.2


def clock(timeouts: list[float]) -> KeepAlive:
    loop = asyncio.get_running_loop()
    return KeepAlive(loop, SECONDS, lambda: timeouts.append(loop.time()))


async def test_an_idle_connection_times_out_after_its_seconds_from_its_last_idle() -> None:
    timeouts: list[float] = []
    keep = clock(timeouts)
    loop = asyncio.get_running_loop()
    keep.idle()
    await asyncio.sleep(SECONDS / 2)
    keep.busy()  # a request arrives: the timer stays armed and must not close it
    await asyncio.sleep(SECONDS / 4)
    idle_again = loop.time()
    keep.idle()
    await asyncio.sleep(SECONDS * 1.5)
    assert len(timeouts) == 1
    # Not when the first timer fired (SECONDS after the first idle), which found it
    # idle for less: SECONDS after it last went idle.
    assert timeouts[0] - idle_again >= SECONDS - 0.01
    await asyncio.sleep(SECONDS * 1.5)
    assert len(timeouts) == 1  # once


async def test_a_busy_connection_never_times_out_and_is_timed_again_once_idle() -> None:
    timeouts: list[float] = []
    keep = clock(timeouts)
    keep.idle()
    keep.busy()
    await asyncio.sleep(SECONDS * 2)  # a long poll, say
    assert timeouts == []
    keep.idle()
    await asyncio.sleep(SECONDS * 1.5)
    assert len(timeouts) == 1


async def test_cancel_stops_it() -> None:
    timeouts: list[float] = []
    keep = clock(timeouts)
    keep.idle()
    keep.cancel()
    await asyncio.sleep(SECONDS * 1.5)
    assert timeouts == []


async def test_many_requests_make_one_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()
    made = 0
    call_later = loop.call_later

    def counting(delay: float, callback: Any, *args: Any) -> asyncio.TimerHandle:
        nonlocal made
        made += 1
        return call_later(delay, callback, *args)

    monkeypatch.setattr(loop, "call_later", counting)
    keep = clock([])
    for _ in range(100):
        keep.busy()
        keep.idle()
    assert made == 1
    keep.cancel()
