"""Announcements (gateway/claim/announcements.py): the bumps of announcements made while
a round trip is on its way go together in the next one, each runtime once; every
announcement waits for a bump sent after it was made (I1); a lost bump is logged and
wakes the pump all the same, never raised."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from gateway import logs
from gateway.claim.announcements import Announcements
from gateway.errors import CacheUnavailable


class SlowCache:
    """bump and bump_many that wait for the test to let each round trip back."""

    def __init__(self) -> None:
        self.sent: list[list[str]] = []  # each round trip's runtimes, in order
        self.back = asyncio.Event()
        self.fail = False

    async def _trip(self, runtime_ids: Sequence[str]) -> list[str | None]:
        self.sent.append(list(runtime_ids))
        await self.back.wait()
        self.back.clear()
        if self.fail:
            raise CacheUnavailable("Redis is down")
        return [f"v{len(self.sent)}-{rt}" for rt in runtime_ids]

    async def bump(self, runtime_id: str) -> str:
        [version] = await self._trip([runtime_id])
        assert version is not None
        return version

    async def bump_many(self, runtime_ids: Sequence[str]) -> list[str | None]:
        assert len(runtime_ids) > 1, "one runtime goes as one bump"
        return await self._trip(runtime_ids)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_bumps_made_during_a_round_trip_go_together_in_the_next() -> None:
    cache = SlowCache()
    woken: list[tuple[str, str | None]] = []
    announcements = Announcements(cache, lambda rt, v: woken.append((rt, v)))  # type: ignore[arg-type]
    first = announcements.announce("a")
    await settle()
    assert cache.sent == [["a"]]  # alone: sent at once, as one bump
    # Made while that round trip is on its way: none is done by its return.
    later = [announcements.announce(rt) for rt in ("b", "a", "c", "b")]
    await settle()
    cache.back.set()
    await asyncio.wait_for(first, 1)
    await settle()
    assert not any(done.done() for done in later)
    assert cache.sent == [["a"], ["b", "a", "c"]]  # each runtime once
    cache.back.set()
    await asyncio.wait_for(asyncio.gather(*later), 1)
    assert woken == [("a", "v1-a"), ("b", "v2-b"), ("a", "v2-a"), ("c", "v2-c")]
    await announcements.close()


async def test_a_lost_bump_wakes_the_pump_and_is_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache = SlowCache()
    cache.fail = True
    woken: list[tuple[str, str | None]] = []
    announcements = Announcements(cache, lambda rt, v: woken.append((rt, v)))  # type: ignore[arg-type]
    done = announcements.announce("a")
    await settle()
    cache.back.set()
    await asyncio.wait_for(done, 1)
    assert woken == [("a", None)]
    assert "version bumps lost for runtimes a" in caplog.text
    # The sender is gone, and the next announcement starts another.
    again = announcements.announce("b")
    await settle()
    cache.fail = False
    cache.back.set()
    await asyncio.wait_for(again, 1)
    assert woken[-1] == ("b", "v2-b")
    await announcements.close()


async def test_the_sender_works_in_no_request_of_its_own() -> None:
    """Started by the first request that announces, it sends for every later one: its
    lines and spans must carry none of those requests' ids."""
    cache = SlowCache()
    seen: list[str | None] = []
    announcements = Announcements(cache, lambda rt, v: seen.append(logs.REQUEST_ID.get()))  # type: ignore[arg-type]

    async def request(request_id: str, runtime_id: str) -> None:
        logs.REQUEST_ID.set(request_id)
        await announcements.announce(runtime_id)

    first = asyncio.create_task(request("req-a", "a"))
    await settle()
    later = asyncio.create_task(request("req-b", "b"))
    await settle()
    cache.back.set()
    await settle()
    cache.back.set()
    await asyncio.wait_for(asyncio.gather(first, later), 1)
    assert seen == [None, None]
    await announcements.close()
