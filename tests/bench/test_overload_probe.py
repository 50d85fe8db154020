"""The overload scenario's well-behaved clients: answers to requests sent while the
flood's connections open are counted apart from the percentiles the targets judge."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web

from bench import overload


async def test_answers_to_requests_sent_in_the_onset_are_kept_out_of_the_percentiles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server slow (250 ms) for what arrives in its first 0.3 s, quick after: the
    slow answers are the onset's, and the p99 is of the quick ones."""
    monkeypatch.setattr(overload, "PROBE_ONSET_SECONDS", 0.3)
    monkeypatch.setattr(overload, "PROBE_CLIENTS", 4)
    monkeypatch.setattr(overload, "PROBE_INTERVAL_SECONDS", 0.02)
    started = time.perf_counter()

    async def enqueue(request: web.Request) -> web.Response:
        if time.perf_counter() - started < 0.3:
            await asyncio.sleep(0.25)
        return web.json_response({"id": "t"}, status=201)

    app = web.Application()
    app.router.add_post("/v1/runtimes/{rt}/tasks", enqueue)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    stop = asyncio.Event()
    try:
        probing = asyncio.create_task(overload._probe(f"http://127.0.0.1:{port}", "t", stop))
        await asyncio.sleep(1.2)
        stop.set()
        got = await probing
    finally:
        await runner.cleanup()
    assert got["onset"]["ok"] >= 4, got  # each client's first request at least
    assert got["onset"]["max_ms"] >= 250, got
    assert got["ok"] >= overload.PROBE_MIN_SAMPLES, got
    assert got["p99_ms"] < 200, got  # none of the slow answers in it
    assert got["refused"] == got["failed"] == 0, got
