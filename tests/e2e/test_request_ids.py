"""Every answer carries X-Request-ID, the client's when sane, including errors and the
answers the server writes itself (408, 431); each request is counted once by route
template and status class, and its access line carries the same id, as does every line
logged while serving it."""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from gateway.http.server import MAX_HEAD_BYTES
from gateway.logs import JsonFormatter
from tests.support.connections import (
    MARGIN,
    READ_TIMEOUT,
    SHORT_DEADLINE,
    Conn,
    request,
)
from tests.support.gateways import Instance
from tests.support.logs import Records
from tests.support.metrics import sample
from tests.support.waiting import wait_until

pytestmark = pytest.mark.asyncio(loop_scope="module")

GENERATED = re.compile(r"[0-9a-f]{32}")


@pytest.fixture(scope="module")
def gateway_options() -> dict[str, Any]:
    return {**SHORT_DEADLINE, "access_log_sample": 1.0}  # every request's line


def requests(gw: Instance, route: str, method: str, status_class: str) -> float:
    return sample(
        gw, "gateway_http_requests_total", route=route, method=method, status_class=status_class
    )


@pytest.fixture
def access_log() -> Iterator[None]:
    """The access log at INFO for the test (the harness logs warnings and worse)."""
    logger = logging.getLogger("gateway.access")
    level = logger.level
    logger.setLevel(logging.INFO)
    yield
    logger.setLevel(level)


def access_lines(records: Records, request_id: str) -> list[logging.LogRecord]:
    return [
        r
        for r in records.records
        if r.name == "gateway.access" and getattr(r, "request_id", None) == request_id
    ]


async def test_a_sane_client_id_is_returned_logged_and_counted(
    gw: Instance, tcp: Conn, server_logs: Records, access_log: None
) -> None:
    before = requests(gw, "/healthz", "GET", "2xx")
    await tcp.send(request("GET", "/healthz", extra="X-Request-ID: probe.1:a-b_c\r\n"))
    answer = await tcp.answer(MARGIN)
    assert answer.status == 200 and answer.headers["x-request-id"] == "probe.1:a-b_c"
    assert requests(gw, "/healthz", "GET", "2xx") == before + 1
    # The line is written by the access log's own thread, soon after the answer.
    await wait_until(lambda: bool(access_lines(server_logs, "probe.1:a-b_c")), 5, "its line")
    (line,) = access_lines(server_logs, "probe.1:a-b_c")
    assert (line.route, line.status, line.method) == ("/healthz", 200, "GET")  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("method", "path", "status", "route"),
    [
        ("GET", "/v1/runtimes/some-rt/nothing", 404, "unmatched"),
        ("DELETE", "/healthz", 405, "/healthz"),
        ("GET", "/v1/tasks/not-a-uuid", 404, "/v1/tasks/{task_id}"),
    ],
)
async def test_errors_carry_a_generated_id_and_count_by_template(
    gw: Instance, tcp: Conn, method: str, path: str, status: int, route: str
) -> None:
    before = requests(gw, route, method, "4xx")
    await tcp.send(request(method, path, extra="X-Request-ID: spaces are not allowed\r\n"))
    answer = await tcp.answer(MARGIN)
    assert answer.status == status, answer
    assert GENERATED.fullmatch(answer.headers["x-request-id"]), answer.headers
    assert requests(gw, route, method, "4xx") == before + 1


async def test_an_early_413_carries_the_clients_id(gw: Instance, tcp: Conn) -> None:
    head = request("POST", "/v1/runtimes/rt/tasks", extra="X-Request-ID: big-1\r\n")
    head = head.replace(b"Content-Length: 0", b"Content-Length: 2000000000")
    await tcp.send(head)
    answer = await tcp.answer(MARGIN)
    assert answer.status == 413 and answer.headers["x-request-id"] == "big-1"


async def test_the_servers_own_431_carries_an_id_and_is_counted(gw: Instance, tcp: Conn) -> None:
    before = requests(gw, "unmatched", "-", "4xx")
    big = "X-Big: " + "a" * MAX_HEAD_BYTES + "\r\n"
    await tcp.send(request("GET", "/healthz", extra=big))
    answer = await tcp.answer(MARGIN)
    assert answer.status == 431 and GENERATED.fullmatch(answer.headers["x-request-id"])
    assert requests(gw, "unmatched", "-", "4xx") == before + 1


async def test_the_servers_own_408_keeps_the_clients_id(gw: Instance, tcp: Conn) -> None:
    before = requests(gw, "unmatched", "POST", "4xx")
    head = request("POST", "/v1/runtimes/rt/tasks", extra="X-Request-ID: slow-1\r\n")
    await tcp.send(head.replace(b"Content-Length: 0", b"Content-Length: 10"))
    answer = await tcp.answer(READ_TIMEOUT + MARGIN)
    assert answer.status == 408 and answer.headers["x-request-id"] == "slow-1"
    assert requests(gw, "unmatched", "POST", "4xx") == before + 1


class JsonLines(logging.Handler):
    """Formats each record as `gateway serve` would, at once, in the logging call's
    context: where the request id lives."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(JsonFormatter())
        self.lines: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(orjson.loads(self.format(record)))


async def test_a_500_and_its_traceback_line_carry_the_request_id(
    gw: Instance, tcp: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(task_id: uuid.UUID) -> None:
        raise RuntimeError("the store broke")

    monkeypatch.setattr(gw.gateway.store, "get", broken)
    handler = JsonLines()
    logger = logging.getLogger("gateway")
    logger.addHandler(handler)
    try:
        path = f"/v1/tasks/{uuid.uuid4()}"
        await tcp.send(request("GET", path, extra="X-Request-ID: fail-1\r\n"))
        answer = await tcp.answer(MARGIN)
    finally:
        logger.removeHandler(handler)
    assert answer.status == 500 and answer.headers["x-request-id"] == "fail-1"
    [line] = [line for line in handler.lines if line["logger"] == "gateway.http"]
    assert line["request_id"] == "fail-1" and line["level"] == "ERROR"
    assert "RuntimeError: the store broke" in line["exception"]
