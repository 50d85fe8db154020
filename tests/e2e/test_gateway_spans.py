"""The gateway's own spans, exported over OTLP/HTTP by a real `gateway serve` with the
OpenTelemetry SDK to a receiver that decodes the real protobuf (tests/support/otlp.py):
a server span per request, a child of the request's `traceparent`, named by its route
template; a producer span per enqueued task, a child of the server span (or of a batch
item's own context), whose context is what the task stores and answers; contexts never
mixed between concurrent requests; a claim's Postgres statement and Redis calls as
client spans (children of its server span, or linked to each poll one statement
serves), an event on a woken poll's server span, and a receive span linked to the
stored context of each task a claim hands out; JSON log lines that name the span of
their request. And a start whose variables ask for traces without
the SDK installed is refused in one line."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio

from tests.support.credentials import sign, unique
from tests.support.gateways import serve_env, serve_process, serve_refused
from tests.support.otlp import Span, receiver
from tests.support.traced import Traced, traced_gateway
from tests.support.waiting import within

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.integration]

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER = "00f067aa0ba902b7"
PARENT = f"00-{TRACE}-{CALLER}-01"
TASKS_ROUTE = "/v1/runtimes/{rt}/tasks"
BATCH_ROUTE = "/v1/runtimes/{rt}/tasks:batch"


def parent(n: int) -> str:
    """A distinct well-formed, sampled traceparent per n."""
    return f"00-{n + 1:032x}-{n + 1:016x}-01"


@pytest_asyncio.fixture(loop_scope="module")
async def traced(database_url: str, redis_url: str, redis_prefix: str) -> AsyncIterator[Traced]:
    # No load shedding: a test's burst of 100 requests, each exporting its spans, can
    # outlast the line's 250 ms on a slow machine, and these tests are about the spans
    # (shedding has tests of its own: test_db_admission, test_shedding).
    unshed = {"GATEWAY_DB_QUEUE_BUDGET_MS": "600000"}
    async with traced_gateway(database_url, redis_url, redis_prefix, **unshed) as gateway:
        yield gateway


async def test_a_request_is_a_server_span_named_by_its_route(
    traced: Traced, runtime_id: str
) -> None:
    headers = {"traceparent": PARENT}
    status, made = await traced.post(f"/v1/runtimes/{runtime_id}/tasks", {"payload": 1}, headers)
    assert status == 201, made
    server = await traced.server_span(TRACE, TASKS_ROUTE)
    assert server.parent_id == CALLER
    assert server.name == f"POST {TASKS_ROUTE}"
    assert server.resource["service.name"] == "claim-gateway"
    assert server.attributes["http.request.method"] == "POST"
    assert server.attributes["http.response.status_code"] == 201
    assert server.attributes["url.scheme"] == "http"
    assert server.attributes["server.address"] == "127.0.0.1"
    assert not server.error


async def test_an_unknown_path_and_a_claim_are_server_spans_too(
    traced: Traced, runtime_id: str
) -> None:
    other = parent(3).split("-")[1]
    status, _ = await traced.post("/v1/nowhere", {}, {"traceparent": parent(3)})
    assert status == 404
    [unmatched] = await traced.spans.wait_for(lambda s: s.trace_id == other)
    assert unmatched.name == "POST" and "http.route" not in unmatched.attributes
    assert unmatched.attributes["http.response.status_code"] == 404
    claim = parent(4)
    status, _ = await traced.post(
        f"/v1/runtimes/{runtime_id}/claim",
        {"worker_id": "w", "max_tasks": 1, "wait_seconds": 0},
        {"traceparent": claim},
    )
    assert status == 200
    server = await traced.server_span(claim.split("-")[1], "/v1/runtimes/{rt}/claim")
    assert server.kind == "SERVER" and server.parent_id == claim.split("-")[2]


def named(answer: dict[str, Any]) -> tuple[str, str]:
    """The (trace id, span id) a task's answered traceparent names. Its flags are the
    SDK's: sampled, and `random` (03) for a trace id the gateway made."""
    _, trace_id, span_id, flags = answer["trace"]["traceparent"].split("-")
    assert flags in ("01", "03")
    return trace_id, span_id


def ids(span: Span) -> tuple[str, str]:
    return span.trace_id, span.span_id


async def test_an_enqueued_task_stores_its_producer_span_a_child_of_the_server_span(
    traced: Traced, runtime_id: str
) -> None:
    # A trace of its own: the server span of the first test is in PARENT's trace too.
    sent = parent(5)
    _, trace_id, caller, _ = sent.split("-")
    headers = {"traceparent": sent, "tracestate": "congo=t61rcWkgMzE"}
    status, made = await traced.post(f"/v1/runtimes/{runtime_id}/tasks", {"payload": 1}, headers)
    assert status == 201, made
    server = await traced.server_span(trace_id, TASKS_ROUTE)  # its attributes: the test above
    assert server.parent_id == caller
    [producer] = await traced.producers(server.span_id)
    assert producer.trace_id == trace_id
    assert producer.name == f"send {runtime_id}"
    assert producer.attributes == {
        "messaging.system": "claim-gateway",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": runtime_id,
        "messaging.message.id": made["id"],
    }
    # What the task stores and answers names the producer span, with the caller's state.
    assert made["trace"] == {"traceparent": producer.traceparent, "tracestate": "congo=t61rcWkgMzE"}
    assert (await traced.get(f"/v1/tasks/{made['id']}"))["trace"] == made["trace"]


async def test_a_request_without_a_context_starts_a_trace_its_task_stores(
    traced: Traced, runtime_id: str
) -> None:
    status, made = await traced.post(f"/v1/runtimes/{runtime_id}/tasks", {"payload": 1})
    assert status == 201, made
    [producer] = await traced.spans.wait_for(
        lambda s: s.attributes.get("messaging.message.id") == made["id"]
    )
    server = await traced.server_span(producer.trace_id, TASKS_ROUTE)
    assert server.parent_id == "" and producer.parent_id == server.span_id
    assert named(made) == ids(producer)


async def test_a_batch_has_a_producer_span_per_task_and_an_items_own_context_wins(
    traced: Traced, runtime_id: str
) -> None:
    own = parent(7)
    items = [{"payload": 1}, {"payload": 2, "trace": {"traceparent": own}}, {"payload": 3}]
    status, made = await traced.post(
        f"/v1/runtimes/{runtime_id}/tasks:batch", {"tasks": items}, {"traceparent": PARENT}
    )
    assert status == 201, made
    first, second, third = made["tasks"]
    server = await traced.server_span(TRACE, BATCH_ROUTE)
    assert server.parent_id == CALLER
    assert server.attributes["messaging.batch.message_count"] == 3
    by_task = {
        s.attributes["messaging.message.id"]: s for s in await traced.producers(server.span_id, 2)
    }
    assert set(by_task) == {first["id"], third["id"]}
    for task in (first, third):
        assert named(task) == ids(by_task[task["id"]])
    # The item's own context is its producer span's parent; the request's is a link.
    [mine] = await traced.producers(own.split("-")[2])
    assert mine.trace_id == own.split("-")[1]
    assert mine.attributes["messaging.message.id"] == second["id"]
    assert [(link.trace_id, link.span_id) for link in mine.links] == [
        (server.trace_id, server.span_id)
    ]
    assert named(second) == ids(mine)


async def test_a_signed_webhook_is_a_producer_span_too(traced: Traced, runtime_id: str) -> None:
    status, hook = await traced.post(
        "/v1/admin/webhook-secrets", {"name": unique("spans"), "runtimes": [runtime_id]}
    )
    assert status == 201, hook
    raw = orjson.dumps({"n": 1})
    headers = {**sign(hook["secret"], raw), "traceparent": parent(11)}
    path = f"/v1/runtimes/{runtime_id}/webhooks"
    async with traced.http.post(path, data=raw, headers=headers) as resp:
        assert resp.status == 201
        made = orjson.loads(await resp.read())
    server = await traced.server_span(parent(11).split("-")[1], "/v1/runtimes/{rt}/webhooks")
    [producer] = await traced.producers(server.span_id)
    assert producer.attributes["messaging.message.id"] == made["id"]
    assert named(made) == ids(producer)


CLAIM_ROUTE = "/v1/runtimes/{rt}/claim"


async def claim_traced(
    traced: Traced, runtime_id: str, traceparent: str, max_tasks: int = 1, wait: float = 0
) -> list[dict[str, Any]]:
    status, got = await traced.post(
        f"/v1/runtimes/{runtime_id}/claim",
        {"worker_id": "w", "max_tasks": max_tasks, "wait_seconds": wait},
        {"traceparent": traceparent},
    )
    assert status == 200, got
    return list(got["tasks"])


async def test_a_claim_has_its_statements_span_and_a_receive_span_linked_to_its_tasks(
    traced: Traced, runtime_id: str
) -> None:
    path = f"/v1/runtimes/{runtime_id}/tasks"
    made = [(await traced.post(path, {"payload": n}, {"traceparent": parent(20 + n)}))[1]
            for n in range(2)]  # fmt: skip
    claim = parent(30)
    tasks = await claim_traced(traced, runtime_id, claim, max_tasks=2)
    assert sorted(t["id"] for t in tasks) == sorted(t["id"] for t in made)
    trace_id = claim.split("-")[1]
    server = await traced.server_span(trace_id, CLAIM_ROUTE)
    in_trace = await traced.spans.wait_for(
        lambda s: s.trace_id == trace_id and s.parent_id == server.span_id, 2
    )
    [statement] = [s for s in in_trace if s.attributes.get("db.system.name") == "postgresql"]
    assert statement.kind == "CLIENT" and statement.name == "UPDATE tasks"
    assert statement.attributes["db.operation.name"] == "UPDATE"
    assert statement.attributes["db.response.returned_rows"] == 2
    [receive] = [s for s in in_trace if s.kind == "CONSUMER"]
    assert receive.name == f"receive {runtime_id}"
    assert receive.attributes["messaging.operation.type"] == "receive"
    assert receive.attributes["messaging.destination.name"] == runtime_id
    assert receive.attributes["messaging.batch.message_count"] == 2
    # Linked to each task's stored context: its producer span.
    assert sorted((link.trace_id, link.span_id) for link in receive.links) == sorted(
        named(t) for t in made
    )


async def test_an_empty_claim_reads_and_writes_the_verdict_in_redis_spans(
    traced: Traced, runtime_id: str
) -> None:
    claim = parent(40)
    assert await claim_traced(traced, runtime_id, claim) == []
    trace_id = claim.split("-")[1]
    server = await traced.server_span(trace_id, CLAIM_ROUTE)
    redis = await traced.spans.wait_for(
        lambda s: s.trace_id == trace_id and s.attributes.get("db.system.name") == "redis", 2
    )
    assert {s.name for s in redis} == {"MGET", "SET"}
    assert all(s.kind == "CLIENT" and s.parent_id == server.span_id for s in redis)
    assert not traced.spans.where(lambda s: s.trace_id == trace_id and s.kind == "CONSUMER")


async def test_a_parked_poll_that_is_woken_says_so_on_its_server_span(
    traced: Traced, runtime_id: str
) -> None:
    claim = parent(50)
    poll = asyncio.ensure_future(claim_traced(traced, runtime_id, claim, wait=10))
    trace_id = claim.split("-")[1]
    # Parked once its verdict was written (an empty scan, then the SET).
    await traced.spans.wait_for(lambda s: s.trace_id == trace_id and s.name == "SET")
    status, made = await traced.post(f"/v1/runtimes/{runtime_id}/tasks", {"payload": 1})
    assert status == 201
    [task] = await poll
    assert task["id"] == made["id"]
    server = await traced.server_span(trace_id, CLAIM_ROUTE)
    assert "claim_gateway.poll.woken" in server.events


async def test_one_statement_for_several_polls_links_to_each(
    traced: Traced, runtime_id: str
) -> None:
    claims = [parent(60 + n) for n in range(3)]
    polls = [asyncio.ensure_future(claim_traced(traced, runtime_id, c, wait=10)) for c in claims]
    traces = {c.split("-")[1] for c in claims}

    async def parked() -> bool:
        stats = await traced.get(f"/v1/runtimes/{runtime_id}/stats")
        return bool(stats["parked_pollers"] == 3)

    await within(10, parked)
    path = f"/v1/runtimes/{runtime_id}/tasks:batch"
    status, _ = await traced.post(path, {"tasks": [{"payload": n} for n in range(3)]})
    assert status == 201
    assert sorted(len(tasks) for tasks in await asyncio.gather(*polls)) == [1, 1, 1]
    servers = {
        (s.trace_id, s.span_id)
        for s in await traced.spans.wait_for(
            lambda s: s.trace_id in traces and s.kind == "SERVER", 3
        )
    }
    shared = traced.spans.where(
        lambda s: (
            s.attributes.get("db.system.name") == "postgresql"
            and len({(lk.trace_id, lk.span_id) for lk in s.links} & servers) > 1
        )
    )
    assert shared, "no statement served several polls at once"
    assert all(s.parent_id == "" for s in shared)


async def test_concurrent_requests_never_mix_their_contexts(
    traced: Traced, runtime_id: str
) -> None:
    count = 100
    path = f"/v1/runtimes/{runtime_id}/tasks"
    answers = await asyncio.gather(
        *(traced.post(path, {"payload": n}, {"traceparent": parent(n)}) for n in range(count))
    )
    assert [status for status, _ in answers] == [201] * count
    servers = await traced.spans.wait_for(
        lambda s: s.kind == "SERVER" and s.attributes.get("http.route") == TASKS_ROUTE
        and s.parent_id in {parent(n).split("-")[2] for n in range(count)},
        count,
    )  # fmt: skip
    server_of = {s.parent_id: s for s in servers}
    producers = {
        s.parent_id: s
        for s in await traced.spans.wait_for(
            lambda s: (
                s.kind == "PRODUCER"
                and s.attributes.get("messaging.destination.name") == runtime_id
            ),
            count,
        )
    }
    for n, (_, made) in enumerate(answers):
        _, trace_id, caller, _ = parent(n).split("-")
        server = server_of[caller]
        assert server.trace_id == trace_id
        producer = producers[server.span_id]
        assert producer.trace_id == trace_id
        assert producer.attributes["messaging.message.id"] == made["id"]
        assert named(made) == ids(producer)


async def test_json_log_lines_of_a_traced_request_name_its_server_span(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    async with receiver() as spans:
        env = serve_env(
            database_url,
            redis_url,
            redis_prefix,
            GATEWAY_LOG_FORMAT="json",
            GATEWAY_ACCESS_LOG_SAMPLE="1",
            **spans.env(),
        )
        async with serve_process(env=env) as (proc, base):
            assert proc.stderr is not None
            async with aiohttp.ClientSession(base_url=base) as http:
                traced = Traced(spans, http)
                path = f"/v1/runtimes/{runtime_id}/tasks"
                status, _ = await traced.post(path, {"payload": 1}, {"traceparent": PARENT})
                assert status == 201
                server = await traced.server_span(TRACE, TASKS_ROUTE)
            proc.terminate()  # a drain: the access log's waiting lines are written first
            err = await proc.stderr.read()
            await proc.wait()
    lines = [orjson.loads(raw) for raw in err.splitlines() if raw.startswith(b"{")]
    [access] = [ln for ln in lines if ln.get("route") == TASKS_ROUTE]
    assert (access["trace_id"], access["span_id"]) == (TRACE, server.span_id)
    # Lines written outside any request's span carry none.
    outside = [ln for ln in lines if "route" not in ln]
    assert outside and not any("trace_id" in ln for ln in outside)


async def test_a_start_asking_for_traces_without_the_sdk_is_refused_in_one_line(
    database_url: str, redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    # A package named opentelemetry with nothing in it, first on the path: the SDK and
    # the exporter cannot be imported, as where they were never installed.
    (tmp_path / "opentelemetry").mkdir()
    (tmp_path / "opentelemetry" / "__init__.py").write_text('"""Not the SDK."""\n')
    env = serve_env(
        database_url,
        redis_url,
        redis_prefix,
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:4318",
        PYTHONPATH=str(tmp_path),
    )
    code, lines = await serve_refused(env=env)
    assert code == 2, lines
    assert lines == [
        "gateway: OTEL_EXPORTER_OTLP_ENDPOINT asks for traces, but opentelemetry-sdk and "
        "opentelemetry-exporter-otlp-proto-http are not installed: "
        "pip install 'claim-gateway[otel]', or unset it"
    ]
