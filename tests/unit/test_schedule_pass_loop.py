"""The tick pass's bumps and rest, with fakes for the store and Redis: the runtimes a
pass's batches made tasks in are each bumped after the commit that made them (I1), once
per round trip however many batches named them, and the leader rests until just after
the earliest next tick, never longer than the pass interval and never in a busy loop."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.errors import StoreUnavailable
from gateway.metrics import Metrics
from gateway.schedules import service
from gateway.schedules.service import Bumps, Scheduler
from gateway.settings import Settings


class Announcer:
    """Records each round trip's runtimes; a round trip waits for `gate` when set."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.gate: asyncio.Event | None = None

    async def __call__(self, runtime_ids: Sequence[str]) -> None:
        self.calls.append(list(runtime_ids))
        if self.gate is not None:
            await self.gate.wait()


async def test_runtimes_waiting_for_their_bump_are_bumped_once() -> None:
    announce = Announcer()
    bumps = Bumps(announce)
    bumps.add(["a", "b"])
    bumps.add(["b", "c"])  # the first batch's bumps have not gone out yet
    await bumps.finish()
    assert announce.calls == [["a", "b", "c"]]


async def test_a_runtime_added_while_its_bump_is_out_is_bumped_again_after() -> None:
    announce = Announcer()
    announce.gate = asyncio.Event()
    bumps = Bumps(announce)
    bumps.add(["a"])
    while not announce.calls:
        await asyncio.sleep(0)
    # "a"'s bump may have reached Redis before this commit: it must go out again.
    bumps.add(["a", "b"])
    announce.gate.set()
    await bumps.finish()
    assert announce.calls == [["a"], ["a", "b"]]


async def test_bumps_go_out_in_round_trips_of_a_bounded_size(monkeypatch) -> None:
    monkeypatch.setattr(service, "BUMPS_PER_ROUND_TRIP", 2)
    announce = Announcer()
    bumps = Bumps(announce)
    bumps.add(["a", "b", "c", "d", "e"])
    await bumps.finish()
    assert announce.calls == [["a", "b"], ["c", "d"], ["e"]]


async def test_finish_raises_what_the_bumps_died_of() -> None:
    async def broken(runtime_ids: Sequence[str]) -> None:
        raise RuntimeError("boom")

    bumps = Bumps(broken)
    bumps.add(["a"])
    with pytest.raises(RuntimeError, match="boom"):
        await bumps.finish()


def scheduler(due_in: Any) -> Scheduler:
    async def next_due_in() -> float | None:
        if isinstance(due_in, Exception):
            raise due_in
        return due_in  # type: ignore[no-any-return]

    store: Any = SimpleNamespace(next_due_in=next_due_in)
    return Scheduler(store, Announcer(), Settings(), Metrics(), leading=lambda: True)


@pytest.mark.parametrize(
    ("due_in", "rest"),
    [
        (0.1, 0.1 + service.DUE_MARGIN_SECONDS),  # wakes just after the next tick
        (30.0, service.PASS_INTERVAL_SECONDS),  # never longer than the interval
        (None, service.PASS_INTERVAL_SECONDS),  # no schedule at all
        (-2.0, service.MIN_REST_SECONDS),  # due but held by another transaction
        (0.0, service.MIN_REST_SECONDS),
    ],
)
async def test_the_leader_rests_until_just_after_the_next_tick(due_in, rest) -> None:
    assert await scheduler(due_in)._rest() == pytest.approx(rest)


async def test_a_failed_read_of_the_next_tick_rests_the_interval() -> None:
    assert await scheduler(StoreUnavailable("down"))._rest() == service.PASS_INTERVAL_SECONDS
