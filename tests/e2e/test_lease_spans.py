"""A task's whole life in its own trace, from a real `gateway serve` exporting over
OTLP/HTTP (tests/support/traced.py): a `queued` span per attempt, from when it was due
to its claim; a `lease` span per attempt, from its claim to the fail, complete or
release that ended it, or to the janitor's reclaim when it lapsed: a child of the
stored context, with the id its heartbeats named; a short span per heartbeat and per
cancel request inside that lease. Single and batch operations alike, and the
acknowledgements a claim carries. And the claim delay's exemplars name the task's trace
when the scrape asks for OpenMetrics."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from tests.support.otlp import Span
from tests.support.traced import Traced, traced_gateway

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.integration]

# The lease id holds the database's clock in milliseconds; the lease ends on the
# gateway's clock, in nanoseconds.
CLOCKS_NS = 2_000_000


@pytest_asyncio.fixture(loop_scope="module")
async def traced(database_url: str, redis_url: str, redis_prefix: str) -> AsyncIterator[Traced]:
    # Janitor passes every 0.2 s: a lapsed lease is taken back at once.
    async with traced_gateway(
        database_url, redis_url, redis_prefix, GATEWAY_JANITOR_INTERVAL_SECONDS="0.2"
    ) as gateway:
        yield gateway


async def enqueue(traced: Traced, runtime_id: str, n: int) -> tuple[str, str]:
    """A task enqueued in a trace of its own; its id and trace id."""
    status, task = await traced.post(
        f"/v1/runtimes/{runtime_id}/tasks",
        {"payload": n},
        {"traceparent": f"00-{n:032x}-{n:016x}-01"},
    )
    assert status == 201, task
    return task["id"], task["trace"]["traceparent"].split("-")[1]


async def claim(traced: Traced, runtime_id: str, **fields: Any) -> dict[str, Any]:
    status, answer = await traced.post(
        f"/v1/runtimes/{runtime_id}/claim",
        {"worker_id": "w", "max_tasks": 1, "wait_seconds": 0, **fields},
    )
    assert status == 200, answer
    return answer


async def only(traced: Traced, runtime_id: str) -> dict[str, Any]:
    [task] = (await claim(traced, runtime_id))["tasks"]
    return task


async def producer_of(traced: Traced, trace_id: str) -> Span:
    """The trace's producer span, once it has been exported (in batches, apart from the
    spans the other helpers wait for: it may come later than they do)."""
    [producer] = await traced.spans.wait_for(
        lambda s: s.trace_id == trace_id and s.kind == "PRODUCER"
    )
    return producer


async def named(traced: Traced, trace_id: str, prefix: str, count: int) -> list[Span]:
    """The spans of the trace whose names start with `prefix`, oldest first."""
    found = await traced.spans.wait_for(
        lambda s: s.trace_id == trace_id and s.name.startswith(prefix), count
    )
    return sorted(found, key=lambda s: s.start_ns)


async def test_two_attempts_each_wait_and_lease_with_its_heartbeats(
    traced: Traced, runtime_id: str
) -> None:
    task_id, trace_id = await enqueue(traced, runtime_id, 101)
    first = await only(traced, runtime_id)
    lease = {"lease_id": first["lease_id"]}
    assert (await traced.post(f"/v1/tasks/{task_id}/heartbeat", lease))[0] == 200
    failed = {**lease, "error": "boom", "retry_after_seconds": 0}
    assert (await traced.post(f"/v1/tasks/{task_id}/fail", failed))[0] == 200
    second = await only(traced, runtime_id)
    item = {"id": task_id, "lease_id": second["lease_id"]}
    status, beat = await traced.post("/v1/tasks:heartbeat", {"tasks": [item]})
    assert status == 200 and beat["results"][0]["outcome"] == "extended", beat
    status, done = await traced.post("/v1/tasks:complete", {"tasks": [item]})
    assert status == 200 and done["results"][0]["outcome"] == "completed", done

    producer = await producer_of(traced, trace_id)
    queued = await named(traced, trace_id, "queued ", 2)
    leases = await named(traced, trace_id, "lease ", 2)
    beats = await named(traced, trace_id, "heartbeat ", 2)
    assert [s.attributes["claim_gateway.attempt"] for s in queued] == [1, 2]
    assert {s.parent_id for s in [*queued, *leases]} == {producer.span_id}
    assert [s.attributes["messaging.operation.name"] for s in leases] == ["fail", "complete"]
    assert [s.attributes["claim_gateway.outcome"] for s in leases] == ["queued", "completed"]
    assert [s.attributes["claim_gateway.lease.id"] for s in leases] == [
        first["lease_id"],
        second["lease_id"],
    ]
    for wait, held, beat_span in zip(queued, leases, beats, strict=True):
        assert held.kind == "CONSUMER" and held.attributes["messaging.message.id"] == task_id
        assert held.attributes["messaging.operation.type"] == "settle"
        assert beat_span.parent_id == held.span_id, "a heartbeat is inside its own lease"
        assert wait.start_ns <= wait.end_ns <= held.start_ns + CLOCKS_NS
        assert held.start_ns <= beat_span.start_ns + CLOCKS_NS and beat_span.end_ns <= held.end_ns
    assert leases[0].end_ns <= queued[1].end_ns + CLOCKS_NS, "the retry waited after the fail"


async def test_a_cancel_request_is_inside_the_lease_the_complete_then_ends(
    traced: Traced, runtime_id: str
) -> None:
    task_id, trace_id = await enqueue(traced, runtime_id, 102)
    task = await only(traced, runtime_id)
    status, cancelled = await traced.post(f"/v1/tasks/{task_id}/cancel", {})
    assert status == 200 and cancelled["cancel_requested"], cancelled
    status, ended = await traced.post(
        f"/v1/tasks/{task_id}/complete", {"lease_id": task["lease_id"]}
    )
    assert status == 200 and ended["status"] == "cancelled", ended
    [lease] = await named(traced, trace_id, "lease ", 1)
    [cancel] = await named(traced, trace_id, "cancel requested ", 1)
    assert cancel.parent_id == lease.span_id
    assert lease.attributes["claim_gateway.outcome"] == "cancelled"
    # A second complete with the same lease is a repeat: no second lease span. The
    # SDK exports spans in the order they end: once a later span has arrived, a second
    # lease span would have too.
    again = await traced.post(f"/v1/tasks/{task_id}/complete", {"lease_id": task["lease_id"]})
    assert again[0] == 200
    _, marker = await enqueue(traced, runtime_id, 106)
    await named(traced, marker, "send ", 1)
    assert len(traced.spans.where(lambda s: s.trace_id == trace_id and s.name == lease.name)) == 1


async def test_a_claim_s_acknowledgements_and_a_release_end_their_leases(
    traced: Traced, runtime_id: str
) -> None:
    ids = [await enqueue(traced, runtime_id, n) for n in (103, 104, 105)]
    held = [await only(traced, runtime_id) for _ in ids]
    by_id = {t["id"]: t for t in held}
    (done, done_trace), (dead, dead_trace), (back, back_trace) = ids
    answer = await claim(
        traced,
        runtime_id,
        complete=[{"id": done, "lease_id": by_id[done]["lease_id"]}],
        fail=[{"id": dead, "lease_id": by_id[dead]["lease_id"], "error": "no", "retry": False}],
    )
    assert [a["outcome"] for a in answer["acks"]] == ["completed", "dead"], answer
    status, _ = await traced.post(
        f"/v1/tasks/{back}/release", {"lease_id": by_id[back]["lease_id"]}
    )
    assert status == 200
    for trace_id, operation, outcome in (
        (done_trace, "complete", "completed"),
        (dead_trace, "fail", "dead"),
        (back_trace, "release", "queued"),
    ):
        [lease] = await named(traced, trace_id, "lease ", 1)
        assert lease.attributes["messaging.operation.name"] == operation
        assert lease.attributes["claim_gateway.outcome"] == outcome
        assert lease.error == (outcome == "dead")


async def test_a_lease_that_lapses_ends_when_the_janitor_takes_it_back(
    traced: Traced, runtime_id: str
) -> None:
    task_id, trace_id = await enqueue(traced, runtime_id, 107)
    [task] = (await claim(traced, runtime_id, lease_seconds=1))["tasks"]
    [lease] = await named(traced, trace_id, "lease ", 1)
    assert lease.attributes["messaging.operation.name"] == "expire"
    assert lease.attributes["claim_gateway.outcome"] == "queued"
    assert lease.attributes["claim_gateway.lease.id"] == task["lease_id"]
    assert lease.error, "a lease its holder let lapse is an error"
    assert lease.end_ns - lease.start_ns >= 1_000_000_000 - CLOCKS_NS
    # Its next claim is a second attempt in the same trace.
    again = await only(traced, runtime_id)
    assert again["id"] == task_id
    queued = await named(traced, trace_id, "queued ", 2)
    assert [s.attributes["claim_gateway.attempt"] for s in queued] == [1, 2]


async def test_a_wait_for_the_result_is_in_the_task_s_trace(
    traced: Traced, runtime_id: str
) -> None:
    task_id, trace_id = await enqueue(traced, runtime_id, 108)
    waiting = asyncio.create_task(traced.get(f"/v1/tasks/{task_id}?wait_seconds=5"))
    task = await only(traced, runtime_id)
    await asyncio.sleep(0.2)  # the wait has begun by then, as its span will show
    status, _ = await traced.post(f"/v1/tasks/{task_id}/complete", {"lease_id": task["lease_id"]})
    assert status == 200
    assert (await waiting)["status"] == "completed"
    [waited] = await named(traced, trace_id, "result wait ", 1)
    [lease] = await named(traced, trace_id, "lease ", 1)
    assert waited.parent_id == (await producer_of(traced, trace_id)).span_id
    assert waited.attributes["claim_gateway.outcome"] == "completed"
    assert len(waited.links) == 1, "linked to the waiting request's server span"
    assert waited.start_ns <= lease.end_ns <= waited.end_ns + CLOCKS_NS


async def test_the_claim_delay_carries_the_task_s_trace_id_as_an_exemplar(
    traced: Traced, runtime_id: str
) -> None:
    _, trace_id = await enqueue(traced, runtime_id, 109)
    await only(traced, runtime_id)
    headers = {"Accept": "application/openmetrics-text; version=1.0.0,text/plain;q=0.5"}
    async with traced.http.get("/metrics", headers=headers) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
        text = await resp.text()
    # The whole answer is valid OpenMetrics, and the delay's exemplars name traces.
    families = {f.name: f for f in text_string_to_metric_families(text)}
    exemplars = [
        s.exemplar.labels["trace_id"]
        for s in families["gateway_claim_delay_seconds"].samples
        if s.exemplar is not None
    ]
    assert trace_id in exemplars
    async with traced.http.get("/metrics") as resp:  # Prometheus's text: no exemplars
        assert resp.headers["Content-Type"].startswith("text/plain")
        assert "trace_id" not in await resp.text()
