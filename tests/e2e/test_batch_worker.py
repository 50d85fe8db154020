"""The worker loop with batches (concurrency > 1) against a real gateway: every task
handled and completed exactly once, in far fewer requests than tasks, while a second
worker competes for the same runtime."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from gateway_client import AsyncClient, NewTask, Outcome, Task, Worker, WorkerOptions
from tests.support.gateways import TOKEN
from tests.support.metrics import sample

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.integration]

TASKS = 600


def requests_to(gw, route: str) -> float:
    return sample(gw, "gateway_http_requests_total", route=route, method="POST", status_class="2xx")


@pytest.mark.timeout(90)
async def test_two_batching_workers_complete_each_task_exactly_once(gw, runtime_id):
    handled: Counter[str] = Counter()

    async def handler(task: Task) -> dict[str, int]:
        handled[task.id] += 1
        await asyncio.sleep(random.uniform(0, 0.02))
        return {"n": task.payload}

    async with AsyncClient(gw.url, TOKEN) as client:
        for start in range(0, TASKS, 200):
            batch = [NewTask(n) for n in range(start, start + 200)]
            await client.enqueue_batch(runtime_id, batch)
        before = {
            route: requests_to(gw, route)
            for route in ("/v1/tasks:complete", "/v1/tasks/{task_id}/complete")
        }
        options = {"concurrency": 20, "max_tasks_per_poll": 10, "wait_seconds": 1.0}
        workers = [
            Worker(client, runtime_id, handler, WorkerOptions(worker_id=f"w{i}", **options))
            for i in range(2)
        ]
        jobs = [asyncio.create_task(w.run()) for w in workers]
        while (await client.stats(runtime_id)).counts["completed"] < TASKS:
            assert not any(j.done() for j in jobs), [j for j in jobs if j.done()]
            await asyncio.sleep(0.2)
        for w in workers:
            w.stop()
        await asyncio.wait_for(asyncio.gather(*jobs), 30)
        tasks = [t async for t in client.iter_tasks(runtime_id)]

    assert len(tasks) == TASKS and len(handled) == TASKS
    assert set(handled.values()) == {1}  # each handler ran once
    assert all(t.status == "completed" and t.result == {"n": t.payload} for t in tasks)
    assert {t.attempts for t in tasks} == {1}  # never leased twice
    total = Counter[Outcome]()
    for w in workers:
        total.update(w.outcomes)
    assert total == {Outcome.COMPLETED: TASKS}  # each reported once, none lost
    batched = requests_to(gw, "/v1/tasks:complete") - before["/v1/tasks:complete"]
    single = (
        requests_to(gw, "/v1/tasks/{task_id}/complete") - before["/v1/tasks/{task_id}/complete"]
    )
    print(f"{TASKS} completions in {batched:g} batch and {single:g} single requests")
    assert batched + single < TASKS / 2
