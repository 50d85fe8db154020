"""A minimal ASGI driver, for the tests of the bench's floor apps: lifespan, one request,
shutdown. And the gateway's HTTP protocol object for an app, configured as the gateway
serves, for the tests that drive it in their own process (with bench.infra's
MemoryTransport)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from uvicorn.config import Config
from uvicorn.server import ServerState

from gateway.http.server import GatewayHttpProtocol
from gateway.http.startup import StartupGate

App = Callable[..., Any]
Send = Callable[[dict[str, Any]], Any]


@asynccontextmanager
async def lifespan(app: App) -> AsyncIterator[None]:
    """Run the app's startup, yield, run its shutdown; fail when either fails."""
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    await inbox.put({"type": "lifespan.startup"})

    async def send(message: dict[str, Any]) -> None:
        await outbox.put(message)

    task = asyncio.create_task(
        app({"type": "lifespan", "asgi": {"version": "3.0"}}, inbox.get, send)
    )
    started = await asyncio.wait_for(outbox.get(), 5)
    assert started["type"] == "lifespan.startup.complete", started
    try:
        yield
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        stopped = await asyncio.wait_for(outbox.get(), 5)
        await asyncio.wait_for(task, 5)
        assert stopped["type"] == "lifespan.shutdown.complete", stopped


async def post(app: App, path: str, body: bytes) -> tuple[int, bytes]:
    """POST `body` to `path`; the status and the whole answer body."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    sent = [False]

    async def receive() -> dict[str, Any]:
        if not sent[0]:
            sent[0] = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    status = [0]
    chunks: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status[0] = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await asyncio.wait_for(app(scope, receive, send), 5)
    return status[0], b"".join(chunks)


def gateway_protocol(app: App) -> tuple[GatewayHttpProtocol, ServerState]:
    """The gateway's protocol for one connection to `app`, behind an open start-up gate
    and configured as the gateway serves (no proxy headers, no uvicorn access log),
    with its server's state (whose `tasks` are the requests' app tasks)."""
    gate = StartupGate(app)
    gate.open()
    config = Config(
        gate,
        interface="asgi3",
        lifespan="off",
        log_config=None,
        proxy_headers=False,
        access_log=False,  # the gateway writes its own request log instead
    )
    config.load()
    state = ServerState()
    return GatewayHttpProtocol(config, state, {}), state
