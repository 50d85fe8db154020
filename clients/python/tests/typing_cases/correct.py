"""The same calls as misspelt.py, spelt right: mypy must find nothing (test_typing.py)."""

from datetime import UTC, datetime

from gateway_client import AsyncClient, Client, Completion, Failure, ItemOutcome, Task


def blocking() -> None:
    with Client() as gw:
        task: Task = gw.enqueue("demo", {"n": 1}, priority=90)
        task_id: str = gw.enqueue("demo", {"n": 2}, minimal=True, run_at=datetime.now(UTC))
        parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        traced: Task = gw.enqueue("demo", 3, traceparent=parent, tracestate="congo=t61rcWkgMzE")
        if traced.trace is not None:
            print(traced.trace.traceparent, traced.trace.tracestate)
        claimed: list[Task] = gw.claim("demo", "me", wait_seconds=20)
        acked = gw.claim("demo", "me", complete=[Completion(task.id, "l", {"ok": 1})])
        outcomes: list[ItemOutcome] = acked.acks
        print(outcomes, acked.retry_after_seconds)
        finished = gw.wait(task_id, timeout_seconds=5, step_seconds=1)
        if finished.status == "completed" and finished.updated_at is not None:
            print(task.id, claimed, finished.updated_at.isoformat())


async def non_blocking() -> None:
    async with AsyncClient() as gw:
        task: Task = await gw.enqueue("demo", {"n": 1}, priority=90)
        claimed: list[Task] = await gw.claim("demo", "me", wait_seconds=20)
        acked = await gw.claim("demo", "me", fail=[Failure(task.id, "l", "boom", retry=False)])
        print(task.id, claimed, acked.acks, acked.retry_after_seconds)
