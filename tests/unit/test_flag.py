"""gateway.flag.Flag does what asyncio.Event does for the gateway's waits, in less
memory."""

from __future__ import annotations

import asyncio
import sys

from gateway.flag import Flag


async def test_set_wakes_every_waiter_and_later_waits_return_at_once() -> None:
    flag = Flag()
    waits = [asyncio.create_task(flag.wait()) for _ in range(3)]
    await asyncio.sleep(0)
    assert not any(w.done() for w in waits) and not flag.is_set()
    flag.set()
    assert await asyncio.gather(*waits) == [True, True, True]
    assert flag.is_set() and await flag.wait() is True
    flag.clear()
    assert not flag.is_set()
    later = asyncio.create_task(flag.wait())
    await asyncio.sleep(0)
    assert not later.done()
    flag.set()
    assert await later is True


async def test_a_waiter_woken_before_a_clear_still_returns() -> None:
    """As with asyncio.Event: set() then clear() in one turn wakes who waited."""
    flag = Flag()
    wait = asyncio.create_task(flag.wait())
    await asyncio.sleep(0)
    flag.set()
    flag.clear()
    assert await wait is True
    assert not flag.is_set()


async def test_a_cancelled_or_timed_out_wait_leaves_nothing_behind() -> None:
    flag = Flag()
    wait = asyncio.create_task(flag.wait())
    await asyncio.sleep(0)
    wait.cancel()
    await asyncio.gather(wait, return_exceptions=True)
    try:
        await asyncio.wait_for(flag.wait(), 0.01)
    except TimeoutError:
        pass
    assert "0 waiting" in repr(flag)
    flag.set()
    assert flag.is_set()


def test_a_flag_is_a_small_fraction_of_an_event() -> None:
    flag, event = Flag(), asyncio.Event()
    flag_bytes = sys.getsizeof(flag)
    event_bytes = sys.getsizeof(event) + sys.getsizeof(vars(event)) + sys.getsizeof(event._waiters)
    assert flag_bytes * 10 < event_bytes
