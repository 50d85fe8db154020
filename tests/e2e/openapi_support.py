"""Shared by the OpenAPI conformance tests (this module holds no tests): a gateway in
a thread of its own, which synchronous clients such as schemathesis can call, the
document it serves, and the schemathesis checks every answer must pass."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

import schemathesis
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gateway.http import openapi
from gateway.http.routes import ENDPOINTS
from gateway.instance import Gateway
from tests.harness import TOKEN, make_settings, running_gateway

AUTH = {"Authorization": f"Bearer {TOKEN}"}
# Short long polls: a generated wait_seconds is at most 1.
OVERRIDES: dict[str, Any] = {"max_wait_seconds": 1, "janitor_interval_seconds": 3600}
CONFORMANCE = [
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


def document(**overrides: Any) -> dict[str, Any]:
    """The document a gateway with these settings serves."""
    return openapi.build(ENDPOINTS, make_settings("postgresql://", "redis://", "gw", **overrides))


@dataclass
class Served:
    url: str
    gateway: Gateway
    loop: asyncio.AbstractEventLoop

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run a coroutine on the gateway's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)


@contextlib.contextmanager
def gateway_thread(**settings: Any) -> Iterator[Served]:
    """running_gateway(make_settings(**settings)) on an event loop in a thread of its
    own; stops it and waits for the thread afterwards."""
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def serve() -> None:
        stop = box["stop"] = asyncio.Event()
        async with running_gateway(make_settings(**settings)) as inst:
            box["served"] = Served(inst.url, inst.gateway, asyncio.get_running_loop())
            ready.set()
            await stop.wait()

    def run() -> None:
        try:
            asyncio.run(serve())
        except BaseException as exc:
            box["error"] = exc
        finally:
            ready.set()

    thread = threading.Thread(target=run, name="served-gateway", daemon=True)
    thread.start()
    ready.wait(60)
    try:
        if "served" not in box:
            raise RuntimeError(f"the gateway did not start: {box.get('error')!r}")
        yield box["served"]
    finally:
        if "served" in box:
            box["served"].loop.call_soon_threadsafe(box["stop"].set)
        thread.join(60)
        assert not thread.is_alive(), "the served gateway did not stop"


def check(
    schema: schemathesis.BaseSchema,
    method: str,
    path: str,
    response: Any,
    path_parameters: dict[str, str],
) -> None:
    """The answer of operation `method path` is one its document promises."""
    case = schema[path][method].Case(path_parameters=path_parameters)
    case.validate_response(response, checks=CONFORMANCE)
