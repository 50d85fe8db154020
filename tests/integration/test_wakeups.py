"""The shared pub/sub subscriber against a real Redis."""

from __future__ import annotations

import asyncio

from gateway.cache import keys_for, make_client
from gateway.metrics import Metrics
from gateway.wakeups import Subscriber


async def test_forgetting_and_wanting_a_channel_again_keeps_it_subscribed(redis_url, redis_prefix):
    woken: list[str] = []
    sub = Subscriber(
        make_client(redis_url, 0.25, socket_timeout=None, decode_responses=False),
        redis_prefix,
        Metrics(),
        on_wake=woken.append,
        on_reset=lambda: None,
        timeout_seconds=0.25,
    )
    await sub.start()
    publisher = make_client(redis_url, 0.25)
    try:
        channel = keys_for(redis_prefix, "rt").wake
        async with asyncio.timeout(5):
            while not sub.healthy:
                await asyncio.sleep(0.01)
        assert await sub.subscribe(channel)
        # The runtime is forgotten, and a new poll wants it again before the
        # UNSUBSCRIBE reaches Redis.
        sub.unsubscribe(channel)
        assert await sub.subscribe(channel)
        async with asyncio.timeout(5):
            while not (
                sub.confirmed(channel) and await publisher.pubsub_numsub(channel) == [(channel, 1)]
            ):
                await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)  # let a late UNSUBSCRIBE land, if one is coming
        async with asyncio.timeout(5):
            while not woken:
                await publisher.publish(channel, "rt")
                await asyncio.sleep(0.05)
        assert woken[0] == "rt"
    finally:
        await publisher.aclose()
        await sub.stop()
