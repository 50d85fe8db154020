"""Trace contexts through the worker loop, against the in-memory gateway: a handler sees
its task's `trace`, and tasks claimed together each keep their own, as `gateway work`'s
commands see them (TRACEPARENT, TRACESTATE), never a neighbour's nor the worker's."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from gateway_client import Task, TraceContext
from gateway_client.command import CommandHandler
from tests.support.fake_gateway import FakeGateway, make_task, run_until, worker

TASKS = 100
WORKER_TRACE = {
    "TRACEPARENT": "00-ffffffffffffffffffffffffffffffff-ffffffffffffffff-01",
    "TRACESTATE": "worker=1",
}


def traced(n: int) -> Task:
    """Task n of its own trace; every other one has a tracestate too."""
    parent = f"00-{n + 1:032x}-{n + 1:016x}-01"
    return replace(make_task(n), trace=TraceContext(parent, f"t={n}" if n % 2 else None))


async def test_a_handler_sees_its_task_s_trace_or_none():
    fake = FakeGateway()
    one, two = traced(1), make_task(2)
    fake.queue.extend([one, two])
    seen: dict[Any, TraceContext | None] = {}

    async def handler(task: Task) -> None:
        seen[task.payload] = task.trace

    await run_until(worker(fake, handler), lambda: len(fake.named("complete")) == 2)
    assert seen == {1: one.trace, 2: None}


async def test_a_hundred_tasks_of_a_hundred_traces_claimed_at_once_keep_their_own():
    fake = FakeGateway()
    tasks = [traced(n) for n in range(TASKS)]
    fake.queue.extend(tasks)
    script = 'printf "%s|%s" "$TRACEPARENT" "${TRACESTATE:-none}"'
    handler = CommandHandler(["sh", "-c", script], env={**os.environ, **WORKER_TRACE})
    w = worker(fake, handler, concurrency=TASKS, max_tasks_per_poll=TASKS)
    await run_until(w, lambda: len(fake.named("complete")) == TASKS, within=20)

    # One claim handed out all of them, so that their commands ran side by side.
    assert fake.named("claim")[0].args["max_tasks"] == TASKS
    printed = {c.args["task_id"]: c.args["result"]["stdout"] for c in fake.named("complete")}
    expected = {}
    for task in tasks:
        assert task.trace is not None
        expected[task.id] = f"{task.trace.traceparent}|{task.trace.tracestate or 'none'}"
    assert printed == expected
