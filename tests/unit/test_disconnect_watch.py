"""The disconnect watch of a long wait (httpio.DisconnectWatch): it steps receive() by
hand, without a task, so these check what a watching task would do."""

from __future__ import annotations

import asyncio

from gateway.http.io import DisconnectWatch


class FakeReceive:
    """An ASGI receive() that waits on an Event for each message, as uvicorn's does."""

    def __init__(self, messages: list[dict[str, object]]) -> None:
        self.messages = messages
        self.ready = asyncio.Event()
        self.calls = 0

    async def __call__(self) -> dict[str, object]:
        self.calls += 1
        await self.ready.wait()
        self.ready.clear()
        return self.messages.pop(0)


async def test_a_disconnect_is_reported_once_it_arrives() -> None:
    receive = FakeReceive([{"type": "http.disconnect"}])
    left: list[bool] = []
    watch = DisconnectWatch(receive, lambda: left.append(True))
    await asyncio.sleep(0)
    assert left == []
    receive.ready.set()
    for _ in range(3):
        await asyncio.sleep(0)
    assert left == [True]
    watch.stop()  # after the end: harmless


async def test_other_messages_are_read_past_until_the_disconnect() -> None:
    receive = FakeReceive([{"type": "http.request", "body": b"x"}, {"type": "http.disconnect"}])
    left: list[bool] = []
    DisconnectWatch(receive, lambda: left.append(True))
    receive.ready.set()
    for _ in range(3):
        await asyncio.sleep(0)
    assert left == [] and receive.calls == 2
    receive.ready.set()
    for _ in range(3):
        await asyncio.sleep(0)
    assert left == [True]


async def test_stop_releases_the_pending_receive_and_reports_nothing() -> None:
    receive = FakeReceive([{"type": "http.disconnect"}])
    left: list[bool] = []
    watch = DisconnectWatch(receive, lambda: left.append(True))
    assert len(receive.ready._waiters) == 1
    watch.stop()
    # The receive() coroutine was closed: its wait no longer holds a future.
    assert len(receive.ready._waiters) == 0
    receive.ready.set()
    for _ in range(3):
        await asyncio.sleep(0)
    assert left == []


async def test_an_error_from_receive_ends_the_watch_quietly() -> None:
    async def broken() -> dict[str, object]:
        await asyncio.sleep(0)
        raise RuntimeError("connection state is gone")

    left: list[bool] = []
    watch = DisconnectWatch(broken, lambda: left.append(True))
    for _ in range(3):
        await asyncio.sleep(0)
    assert left == []
    watch.stop()
