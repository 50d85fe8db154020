"""How the claim handler asks whether its client left once tasks were leased for it
(gateway/http/handlers/daemon.py): the connection's Caller, told by the gateway's
HTTP protocol, without a read; under another server, Starlette's read."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.requests import Request

from gateway.admission import Caller
from gateway.http.handlers.daemon import _disconnected
from gateway.http.io import CALLER


def request(scope_extra: dict[str, Any], messages: list[dict[str, Any]]) -> Request:
    async def receive() -> dict[str, Any]:
        if not messages:
            pytest.fail("the request's body was read")
        return messages.pop(0)

    scope = {"type": "http", "method": "POST", "path": "/", "headers": [], **scope_extra}
    return Request(scope, receive)


async def test_the_callers_word_is_taken_without_a_read() -> None:
    caller = Caller()
    assert await _disconnected(request({CALLER: caller}, [])) is False
    caller.leave()
    assert await _disconnected(request({CALLER: caller}, [])) is True


async def test_without_a_caller_the_connection_is_read() -> None:
    assert await _disconnected(request({}, [{"type": "http.disconnect"}])) is True
