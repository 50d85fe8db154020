"""CPU per refusal at the door: written by the connection protocol from the read itself,
against started as an app task (the ASGI door, gateway/http/app.py), in one process.

    .venv/bin/python -m bench.refusal_cost [--requests 20000] [--rounds 3]

One keep-alive connection of the gateway's own protocol, fed single enqueues while the
database's line counts as full, each refused with 503 `database_busy`. Its transport
keeps what is written in memory, so the figures leave out the socket's system calls and
the event loop's polling, which both paths pay alike: what differs is the task, the
app's middleware and the ASGI messages that the early path skips. The hold after each
refusal (its Retry-After) is set to 0, so that the next request is read at once.
No server is reached; the app is built but never opened.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from uvicorn.config import Config
from uvicorn.server import ServerState

from gateway.http.app import GatewayApp, create_app
from gateway.http.server import GatewayHttpProtocol
from gateway.settings import Settings

from .infra import MemoryTransport

REQUEST = (
    b"POST /v1/runtimes/rt-1/tasks HTTP/1.1\r\nHost: gateway\r\n"
    b"Authorization: Bearer not-checked-before-the-door\r\n"
    b'Content-Type: application/json\r\nContent-Length: 15\r\n\r\n{"payload": {}}'
)


def _crowded_app() -> GatewayApp:
    """A gateway app whose database line always counts as full; never opened."""
    settings = Settings.from_env(
        {
            "DATABASE_URL": "postgresql://unused@127.0.0.1:1/unused",
            "REDIS_URL": "redis://127.0.0.1:1/0",
            "GATEWAY_ADMIN_TOKEN": "t" * 32,
        }
    )
    app = create_app(settings)
    assert isinstance(app, GatewayApp) and app.gateway is not None and app.shedding is not None
    store = app.gateway.store
    store.crowded = lambda: True  # type: ignore[method-assign]
    store.shed = lambda: None  # type: ignore[method-assign]
    app.shedding._hold_seconds = 0.0
    return app


async def _us_per_refusal(app: GatewayApp, early: bool, requests: int) -> float:
    config = Config(
        app,
        interface="asgi3",
        lifespan="off",
        log_config=None,
        access_log=False,
        proxy_headers=False,  # as the gateway serves: the app is the protocol's own
    )
    config.load()
    state = ServerState()
    protocol = GatewayHttpProtocol(config, state, {})
    if protocol._early is None:
        raise RuntimeError("the protocol found no early_answer on the app")
    if not early:
        protocol._early = None  # every request goes to the app, as before the early path
    transport = MemoryTransport()
    protocol.connection_made(transport)
    started = time.process_time()
    for _ in range(requests):
        protocol.data_received(REQUEST)
        while state.tasks or protocol._held is not None:
            await asyncio.sleep(0)
    spent = time.process_time() - started
    protocol.connection_lost(None)
    answered = transport.written.count(b"HTTP/1.1 503 Service Unavailable")
    if answered != requests:
        raise RuntimeError(f"{answered} refusals written for {requests} requests")
    return spent / requests * 1e6


async def _main(opts: argparse.Namespace) -> None:
    app = _crowded_app()
    for round_ in range(1, opts.rounds + 1):
        task = await _us_per_refusal(app, False, opts.requests)
        early = await _us_per_refusal(app, True, opts.requests)
        print(
            f"round {round_}: app task {task:.1f} us, early {early:.1f} us per refusal "
            f"({early / task:.2f}x)",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000, help="refusals per path")
    parser.add_argument("--rounds", type=int, default=3, help="pairs of runs, alternating")
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
